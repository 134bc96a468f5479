"""kiln: JIT compilation and autotuning of CUDA kernels, from Python.

    import kiln
    y = kiln.gemm(x, w.t(), bias=b, epilogue="gelu")     # tuned on first use, cached across processes
    with kiln.Tuner(cache_dir="/models/cache", mode="strict"):
        y = kiln.gemm(x, w.t())                           # a problem the cache lacks raises kiln.NotFoundError
    kernel = kiln.compile(src, name_expressions=["scale<float>"])
    kernel.launch(grid, block, [x, 2.0, n])

Tensors come in by DLPack (``__dlpack__``) or ``__cuda_array_interface__`` (torch, CuPy, JAX: no copies).
torch is optional: ``import kiln.torch`` registers the custom ops ``torch.ops.kiln.{gemm,rmsnorm,softmax}``;
``import kiln.distributed`` adds kiln's tuned all-reduce on the ranks of a torch.distributed group.
See docs/python.md.
"""
import atexit as _atexit
import contextlib as _contextlib
import dataclasses as _dataclasses
import json as _json
import os as _os
import warnings as _warnings

from . import errors
from .errors import *  # noqa: F401,F403 - the exception classes are kiln.<Name>
from . import _C

_C._set_error_classes(errors.KilnError, errors._BY_CODE, errors.CaptureMissError)

from ._C import Kernel, TunedOp, Tuner, compile, current_tuner, gemm, rmsnorm, softmax  # noqa: E402
from . import cache  # noqa: E402

__version__ = _C.__version__

# The default tuner may be one made in Python (kiln.warmup): dropped before the interpreter goes, so that its
# Python object is released while Python still runs (and a background warm-up is joined then).
_atexit.register(_C._set_default_tuner, None)


@_contextlib.contextmanager
def autotune(tune_mode=True, cache_dir=None):
    """Like FlashInfer's ``autotune()``: inside the block, ops measure what the cache lacks (``tune_mode``
    True) or only use what it has (False, kiln's ``use`` mode); the tuner is yielded."""
    with Tuner(cache_dir=cache_dir, mode="tune" if tune_mode else "use") as tuner:
        yield tuner


def _workload_text(workload):
    if workload is None:
        return None
    if isinstance(workload, list):
        workload = {"name": "python", "problems": workload}
    if isinstance(workload, dict):
        return _json.dumps(workload)
    if not isinstance(workload, (str, _os.PathLike)):  # open() would take an int as a file descriptor
        raise TypeError(f"workload is a file path, its JSON text, a dict or a list of entries, not "
                        f"{type(workload).__name__}")
    if isinstance(workload, _os.PathLike) or not workload.lstrip().startswith("{"):
        # Read by the C++ side (kiln/input.h), bounded by $KILN_MAX_WORKLOAD_BYTES: /dev/zero or a FIFO that never
        # ends is an error naming the path and the limit, not a read until memory runs out.
        return _C._read_workload_file(_os.fspath(workload)).decode("utf-8", errors="replace")
    return workload


@_dataclasses.dataclass
class WarmupReport:
    """What kiln.warmup() made ready. ``compiled`` is 0 on a cache built by ``kiln precompile``;
    ``tuned`` counts problems that had no decision and were measured now. Where the time went:
    ``open_seconds`` (opening the cache and the device's tuner), ``fetch_seconds`` and ``load_seconds``
    (reading cached binaries, and loading them into the context, summed over problems and ``threads``)."""

    problems: int
    ready: int
    from_cached_decision: int
    tuned: int
    compiled: int
    skipped: int
    failed: int
    seconds: float
    errors: list
    open_seconds: float = 0.0
    fetch_seconds: float = 0.0
    load_seconds: float = 0.0
    threads: int = 0
    #: Background warm-up only: problems an op call needed before the warm-up reached them, loaded by that
    #: call (``ready + taken_by_calls == problems`` when nothing failed).
    taken_by_calls: int = 0
    #: The slowest problems to make ready (at most 8, slowest first): dicts of problem, chosen,
    #: fetch_seconds and load_seconds.
    slowest: list = _dataclasses.field(default_factory=list)

    def __str__(self):
        text = (f"{self.ready}/{self.problems} problems ready in {self.seconds * 1e3:.1f} ms: "
                f"{self.from_cached_decision} from cached decisions, {self.tuned} tuned now, "
                f"{self.compiled} kernels compiled, {self.skipped} skipped, {self.failed} failed "
                f"(opening {self.open_seconds * 1e3:.1f} ms; fetching {self.fetch_seconds * 1e3:.1f} ms and loading "
                f"{self.load_seconds * 1e3:.1f} ms over {self.threads} threads)")
        return "\n  ".join([text] + list(self.errors))


class WarmupTask:
    """A warm-up running on background threads (``kiln.warmup(..., wait=False)``). Until it is done, an op
    call of one of its problems waits for it instead of loading the problem again; ``wait()`` returns its
    WarmupReport (raising what a waited-for warm-up would raise)."""

    def __init__(self, tuner):
        self.tuner = tuner

    def done(self):
        return self.tuner._warmup_done()

    def wait(self):
        return WarmupReport(**self.tuner._wait_warmup())

    def __repr__(self):
        return f"<kiln.WarmupTask {'done' if self.done() else 'running'} on {self.tuner!r}>"


def warmup(cache_dir=None, workload=None, *, mode=None, device=0, tuner=None, wait=True, threads=0):
    """Makes the ops' kernels ready before the first request: no compile, no tune on the first call.

    With ``workload`` (a workload file, its JSON text, a dict, or a list of problem entries: the format of
    ``kiln tune --workload``), every problem of it is loaded from the cache (compiled binaries, e.g. from
    ``kiln precompile`` on a build machine, and decisions), measuring only problems without a decision (tune
    mode). Without it, every decision the cache holds for this device is loaded. The tuner (``tuner``, else a
    new ``Tuner(cache_dir, mode)`` when either is given, else the current one) becomes the one the ops use.
    Problems load on ``threads`` threads (0: up to 8). Returns a WarmupReport. Runs without the GIL.

    ``wait=False`` returns a WarmupTask at once and loads in the background (while the engine loads its
    weights): an op call of a problem still loading waits for the warm-up, inside a CUDA-graph capture too,
    so nothing is loaded twice and nothing falls back; ``task.wait()`` gives the report.
    """
    if tuner is None:
        tuner = Tuner(cache_dir=cache_dir and _os.fspath(cache_dir), mode=mode) if (cache_dir or mode) else current_tuner()
    if not wait:
        tuner._start_warmup(_workload_text(workload), device, threads)
        result = WarmupTask(tuner)
    else:
        result = WarmupReport(**tuner._warmup(_workload_text(workload), device, threads))
    if tuner is not current_tuner():
        _C._set_default_tuner(tuner)
    return result


@_dataclasses.dataclass
class Variant:
    """One source variant of an operation, for kiln.tune.

    ``kernel``: an ``extern "C"`` name or a name expression (``"axpy<4>"``). The launch geometry is ``grid``,
    ``block`` and ``shared_mem`` for every problem, or ``geometry(sizes) -> (grid, block[, shared_mem])``.
    ``defines`` become ``-DNAME=VALUE``; ``parameters`` describe the variant in reports.
    """

    name: str
    source: str
    kernel: str
    grid: object = 1
    block: object = 1
    shared_mem: int = 0
    geometry: object = None
    defines: dict = _dataclasses.field(default_factory=dict)
    options: list = _dataclasses.field(default_factory=list)
    include_dirs: list = _dataclasses.field(default_factory=list)
    parameters: dict = _dataclasses.field(default_factory=dict)


def tune(variants, problem_key, check=None, *, op, buffers, reference=None, tolerance=1e-2, attributes=None,
         device=0, tuner=None):
    """Tunes N source variants of one operation on a problem and returns the chosen one, ready to run.

    ``problem_key``: the problem's sizes (an int or a sequence of ints; the first is the size a dispatch would
    follow); with ``attributes`` (a dict of str) and the variants' sources, they key the decision in the cache,
    so a second process gets the chosen variant without tuning. ``op``: the operation's name
    (``"mydsl.axpy"``). ``buffers(sizes, seed)`` makes what a tune runs on: the kernel arguments (as
    Kernel.launch takes them), or ``{"args": [...], "outputs": [...], "inouts": [...]}``: ``outputs`` are
    tensors the kernels only write (poisoned before each checked run, so an element left unwritten fails the
    variant), ``inouts`` tensors they read and write in place (``y = a * x + y``: each checked run starts from
    what buffers() made). Both are among ``args`` and are compared with the ``reference`` variant's (default:
    the first) within ``tolerance``. ``check(sizes, args)`` is your own check after each variant's checked run:
    False or an exception fails that variant. Compiles and benchmarks run without the GIL, the callbacks with
    it. When every variant fails, the reference runs and a RuntimeWarning names the first failure. Returns a
    kiln.TunedOp (``.chosen``, ``.from_cache``, ``.run(args, sizes=None, stream=None)``, ``.report()``).
    """
    sizes = [int(problem_key)] if isinstance(problem_key, int) else [int(s) for s in problem_key]
    result = _C._tune_variants(tuner or current_tuner(), op, list(variants), sizes, buffers, check, reference or "",
                               float(tolerance), {str(k): str(v) for k, v in (attributes or {}).items()}, device)
    if not result.from_cache:
        _warn_if_all_failed(op, _json.loads(result.report()))
    return result


def _warn_if_all_failed(op, report):
    choices = report.get("choices", [])
    if not choices or any(c.get("ok") for c in choices):
        return
    first = choices[0].get("error", "")
    hint = ""
    if "not written or are not finite" in first:
        hint = ('; a tensor the kernels read and write in place belongs under "inouts": under "outputs" it is '
                'poisoned before each checked run')
    _warnings.warn(f"kiln.tune({op!r}): every variant failed, so the reference variant "
                   f"{report.get('chosen')!r} runs unchecked. First failure: {first}{hint}", RuntimeWarning, stacklevel=3)


def precompile(workload, arch="sm_90a", cache_dir=None, *, configs=0, executor=None):
    """Compiles every choice of a workload for ``arch`` into the cache, with no GPU (``kiln precompile``).

    Returns a dict: problems, kernels, cached (already there), compiled, failed, failures, seconds, cache_dir.
    Runs without the GIL.
    """
    return _C._precompile(_workload_text(workload), arch, "" if cache_dir is None else _os.fspath(cache_dir),
                          configs, executor or "")


__all__ = [
    "Kernel", "TunedOp", "Tuner", "Variant", "WarmupReport", "WarmupTask", "autotune", "cache", "compile", "current_tuner", "errors", "gemm",
    "precompile", "rmsnorm", "softmax", "tune", "warmup",
] + errors.__all__
