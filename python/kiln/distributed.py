"""kiln's tuned all-reduce on the ranks of a torch.distributed process group.

    import torch, torch.distributed as dist, kiln.distributed
    dist.init_process_group("nccl")                      # one process per GPU, torch.cuda.set_device(rank) first
    ar = kiln.distributed.AllReduce()                    # collective: every rank of the group calls it
    x = ar.empty(16, 4096)                               # in kiln's symmetric heap: zero-copy all-reduce
    x.copy_(h)
    ar.all_reduce(x)                                     # in place, on torch's current stream
    y, residual = ar.fused_add_rmsnorm(x, residual, w, 1e-5)   # all-reduce + residual add + RMSNorm
    torch.ops.kiln.all_reduce(x, ar.handle)              # the same as a torch custom op (torch.compile, graphs)

Every call runs on the caller's current torch stream, allocates nothing of kiln's and synchronises nothing, so
it can be captured in a CUDA graph. Every rank must make the same calls with the same shapes, as with
torch.distributed. See docs/python.md ("Distributed").
"""
import atexit as _atexit
import json as _json
from typing import Optional, Sequence, Union

import torch
import torch.distributed as _dist

from . import _C, errors

__all__ = ["AllReduce", "CALLS", "all_reduce", "all_reduce_fused_add_rmsnorm"]

_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
# DLPack (type code, bits) of what .empty() makes: the all-reduce's dtypes and a few others for scratch use.
_DLPACK = {torch.bfloat16: (4, 16), torch.float16: (2, 16), torch.float32: (2, 32), torch.float64: (2, 64),
           torch.int8: (0, 8), torch.int32: (0, 32), torch.int64: (0, 64), torch.uint8: (1, 8)}
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64)
# The kinds of call kiln tunes apart (kiln::runtime::AllReduceCall): any tensor (copied into kiln's staging
# buffer), a heap tensor reduced into another tensor, a heap tensor reduced in place.
CALLS = ("staged", "symmetric", "symmetric in-place")


def _error(cls, message):
    e = cls(message)
    e.message = message
    return e


def _group_rank0(group):
    get = getattr(_dist, "get_global_rank", None) or _dist.distributed_c10d._get_global_rank
    return get(group, 0)


class AllReduce(_C.AllReduce):
    """kiln's tuned all-reduce (sum) over the ranks of a torch.distributed process group.

    Collective: every rank of ``group`` (default: the default group) constructs it with the same arguments.
    Rank 0 makes an NCCL unique id, which travels over the group (``broadcast_object_list``); each rank then
    creates kiln's own NCCL communicator on its current CUDA device (``torch.cuda.current_device()``: call
    ``torch.cuda.set_device`` first) and kiln's all-reduce over it: peer-mapped staging buffers of
    ``max_bytes`` and a symmetric heap of ``heap_bytes`` (None: kiln's default), from which ``empty()`` makes
    tensors whose all-reduce needs no copy.

    ``tune``: True measures every size bucket (powers of two from 1 KiB to ``max_bytes``), a list of byte
    sizes measures those, False measures nothing (NCCL runs until ``tune()``). Decisions are stored in the
    kiln cache (``cache_dir``, default ``$KILN_CACHE_DIR``; ``mode`` as ``kiln.Tuner``'s), so a later run
    whose ranks all find them measures nothing. ``calls``: the kinds of call tuned, each with its own table
    (``CALLS``: any tensor, through kiln's staging buffer; a heap tensor out of place; in place). ``hidden_size``
    also tunes the fused all-reduce + residual + RMSNorm step for that hidden size at ``tokens`` rows.

    Keep the object (and tensors from ``empty()``) alive while CUDA graphs captured with it may replay.
    ``close()`` (collective; also ``with AllReduce(...) as ar:``) releases it on every rank; an object that is
    garbage-collected is released then (also collective), and one still open at interpreter exit is left to
    the OS (tearing down there could wait for a rank that has gone).
    """

    def __init__(self, group=None, *, dtype: torch.dtype = torch.bfloat16, max_bytes: int = 256 << 20,
                 heap_bytes: Optional[int] = None, cache_dir=None, mode: Optional[str] = None,
                 tune: Union[bool, Sequence[int]] = True, hidden_size: Optional[int] = None,
                 tokens: Sequence[int] = DEFAULT_TOKENS, calls: Sequence[str] = CALLS, configs: int = 24):
        if not _dist.is_available() or not _dist.is_initialized():
            raise _error(errors.FailedPreconditionError,
                         "kiln.distributed.AllReduce needs an initialised torch.distributed process group "
                         "(torch.distributed.init_process_group first)")
        if dtype not in _DTYPES:
            raise _error(errors.InvalidArgumentError,
                         f"dtype {dtype}: kiln's all-reduce takes torch.bfloat16, torch.float16 or torch.float32")
        if hidden_size is not None and tune is False:
            raise _error(errors.InvalidArgumentError, "hidden_size needs tune (the fused step is tuned after it)")
        if max_bytes <= 0 or (heap_bytes is not None and heap_bytes <= 0):
            raise _error(errors.InvalidArgumentError, "max_bytes and heap_bytes must be positive")
        if not torch.cuda.is_available():
            raise _error(errors.NoDeviceError, "kiln.distributed.AllReduce needs a CUDA device on every rank")
        group = group if group is not None else _dist.group.WORLD
        rank, world = _dist.get_rank(group), _dist.get_world_size(group)
        device = torch.cuda.current_device()
        box = [_C.nccl_unique_id() if rank == 0 else None]
        _dist.broadcast_object_list(box, src=_group_rank0(group), group=group)
        super().__init__(box[0], rank, world, device, _DTYPES[dtype], int(max_bytes), int(heap_bytes or 0),
                         None if cache_dir is None else str(cache_dir), mode, int(configs))
        self.group = group
        self.dtype = dtype
        self.reports = []
        if tune is True:
            self.tune(hidden_size=hidden_size, tokens=tokens, calls=calls)
        elif tune:
            self.tune(sizes=list(tune), hidden_size=hidden_size, tokens=tokens, calls=calls)

    def tune(self, sizes: Optional[Sequence[int]] = None, *, hidden_size: Optional[int] = None,
             tokens: Sequence[int] = DEFAULT_TOKENS, calls: Sequence[str] = CALLS) -> list:
        """Collective. Tunes the all-reduce for every size bucket in ``sizes`` (bytes, ascending; None: powers
        of two from 1 KiB to max_bytes), for each kind of call in ``calls`` (see ``CALLS``), and with
        ``hidden_size`` the fused step at ``tokens`` rows (it replaces the fused table of an earlier hidden
        size). Returns the reports (dicts: bytes, call, chosen, from_cache, choices) and keeps them in
        ``self.reports``. Never call it inside a CUDA-graph capture."""
        if torch.cuda.is_current_stream_capturing():
            raise _error(errors.FailedPreconditionError, "tune() inside a CUDA-graph capture: tune before capturing")
        for call in calls:
            if call not in CALLS:
                raise _error(errors.InvalidArgumentError, f"calls: {call!r} is not one of {CALLS}")
        sizes = [int(s) for s in (sizes or [])]
        reports = []
        if _C.all_reduce_call_kinds:
            for call in calls:
                reports += [_json.loads(r) for r in self._tune(sizes, CALLS.index(call))]
        else:  # a kiln with one kind of call
            reports += [_json.loads(r) for r in self._tune(sizes)]
        if hidden_size is not None:
            rows = sorted({int(t) for t in tokens})
            if not rows or rows[0] <= 0 or hidden_size <= 0:
                raise _error(errors.InvalidArgumentError, "hidden_size and tokens must be positive")
            reports += [_json.loads(r) for r in self._tune_fused(int(hidden_size), rows)]
        self.reports = reports
        return reports

    def empty(self, *size, dtype: Optional[torch.dtype] = None, device=None) -> torch.Tensor:
        """A new uninitialised tensor in kiln's symmetric heap (like ``torch.distributed._symmetric_memory.empty``):
        its all-reduce is zero-copy. ``size`` as ``torch.empty`` takes it; ``dtype`` defaults to the
        all-reduce's; ``device`` must be this rank's (default). Collective: every rank allocates the same sizes
        in the same order. The memory goes back to the heap when the tensor is freed (after the calls that use
        it have run)."""
        if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = tuple(size[0])
        shape = [int(s) for s in size]
        dtype = dtype or self.dtype
        if dtype not in _DLPACK:
            raise _error(errors.InvalidArgumentError, f"empty: dtype {dtype} is not one kiln's heap hands out")
        if device is not None and torch.device(device) != torch.device("cuda", self.device):
            raise _error(errors.InvalidArgumentError,
                         f"empty: device {device}, but this rank's communicator is on cuda:{self.device}")
        code, bits = _DLPACK[dtype]
        return torch.utils.dlpack.from_dlpack(self._empty_capsule(shape, code, bits))

    def choice_for(self, count: int, call: str = "staged") -> str:
        """The name of the choice an all-reduce of ``count`` elements of the kind ``call`` runs (``CALLS``;
        NCCL before tune() and above its sizes)."""
        if call not in CALLS:
            raise _error(errors.InvalidArgumentError, f"call: {call!r} is not one of {CALLS}")
        return self._choice_for(int(count), CALLS.index(call) if _C.all_reduce_call_kinds else -1)

    def close(self) -> None:
        """Collective: releases the buffers, the heap and the communicator on every rank. Refused on every rank
        (kiln.FailedPreconditionError) while a tensor from ``empty()`` is alive on any. Idempotent."""
        self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        state = "closed" if self.closed else f"handle {self.handle}"
        return f"<kiln.distributed.AllReduce rank {self.rank}/{self.world} cuda:{self.device} {self.dtype} {state}>"


def _unfused_step(handle, x, residual, weight, eps, y, residual_out):
    # The fused step outside its tuned table: kiln's all-reduce into a temporary, then torch's residual add and
    # RMSNorm (fp32 statistics, h rounded to the dtype as the fused kernel rounds it). Capturable.
    summed = torch.empty_like(x, memory_format=torch.contiguous_format)
    _C._all_reduce_by_handle(handle, x, summed)
    h = summed.view(residual.shape) + residual
    residual_out.copy_(h.view(residual_out.shape))
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    y.copy_(normed.to(y.dtype).view(y.shape))


_C._set_unfused_step(_unfused_step)
_atexit.register(_C._leak_collectives)

# ---- torch custom ops. "FRAGMENT": kiln.torch owns the namespace's DEF library; this adds to it either way.
_lib = torch.library.Library("kiln", "FRAGMENT")
_lib.define("all_reduce(Tensor(a!) x, int handle) -> ()")
_lib.define("all_reduce_fused_add_rmsnorm(Tensor x, Tensor(a!) residual, Tensor weight, float eps, int handle) "
            "-> Tensor")
# The dispatcher calls kiln's C++ directly; a CPU tensor gets kiln's error rather than torch's "no kernel".
for _key in ("CUDA", "CPU"):
    _lib.impl("all_reduce", _C._op_all_reduce, _key)
    _lib.impl("all_reduce_fused_add_rmsnorm", _C._op_all_reduce_fused_add_rmsnorm, _key)


@torch.library.register_fake("kiln::all_reduce")
def _all_reduce_fake(x, handle):
    return None


@torch.library.register_fake("kiln::all_reduce_fused_add_rmsnorm")
def _fused_fake(x, residual, weight, eps, handle):
    torch._check(x.shape[-1] == weight.shape[0],
                 lambda: f"kiln::all_reduce_fused_add_rmsnorm: hidden size {x.shape[-1]} vs weight {weight.shape[0]}")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


all_reduce = torch.ops.kiln.all_reduce
all_reduce_fused_add_rmsnorm = torch.ops.kiln.all_reduce_fused_add_rmsnorm
