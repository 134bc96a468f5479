"""kiln: JIT compilation and autotuning of CUDA kernels, from Python.

    import kiln
    y = kiln.gemm(x, w.t(), bias=b, epilogue="gelu")     # tuned on first use, cached across processes
    with kiln.Tuner(cache_dir="/models/cache", mode="strict"):
        y = kiln.gemm(x, w.t())                           # a problem the cache lacks raises kiln.NotFoundError
    kernel = kiln.compile(src, name_expressions=["scale<float>"])
    kernel.launch(grid, block, [x, 2.0, n])

Tensors come in by DLPack (``__dlpack__``) or ``__cuda_array_interface__`` (torch, CuPy, JAX: no copies).
torch is optional: ``import kiln.torch`` registers the custom ops ``torch.ops.kiln.{gemm,rmsnorm,softmax}``.
See docs/python.md.
"""
import contextlib as _contextlib
import dataclasses as _dataclasses
import json as _json
import os as _os

from . import errors
from .errors import *  # noqa: F401,F403 - the exception classes are kiln.<Name>
from . import _C

_C._set_error_classes(errors.KilnError, errors._BY_CODE, errors.CaptureMissError)

from ._C import Kernel, TunedOp, Tuner, compile, current_tuner, gemm, rmsnorm, softmax  # noqa: E402
from . import cache  # noqa: E402

__version__ = _C.__version__


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
    if isinstance(workload, _os.PathLike) or not str(workload).lstrip().startswith("{"):
        with open(workload) as f:
            return f.read()
    return workload


@_dataclasses.dataclass
class WarmupReport:
    """What kiln.warmup() made ready. ``compiled`` is 0 on a cache built by ``kiln precompile``;
    ``tuned`` counts problems that had no decision and were measured now."""

    problems: int
    ready: int
    from_cached_decision: int
    tuned: int
    compiled: int
    skipped: int
    failed: int
    seconds: float
    errors: list

    def __str__(self):
        text = (f"{self.ready}/{self.problems} problems ready in {self.seconds * 1e3:.1f} ms: "
                f"{self.from_cached_decision} from cached decisions, {self.tuned} tuned now, "
                f"{self.compiled} kernels compiled, {self.skipped} skipped, {self.failed} failed")
        return "\n  ".join([text] + list(self.errors))


def warmup(cache_dir=None, workload=None, *, mode=None, device=0, tuner=None):
    """Makes the ops' kernels ready before the first request: no compile, no tune on the first call.

    With ``workload`` (a workload file, its JSON text, a dict, or a list of problem entries: the format of
    ``kiln tune --workload``), every problem of it is loaded from the cache (compiled binaries, e.g. from
    ``kiln precompile`` on a build machine, and decisions), measuring only problems without a decision (tune
    mode). Without it, every decision the cache holds for this device is loaded. The tuner (``tuner``, else a
    new ``Tuner(cache_dir, mode)`` when either is given, else the current one) becomes the one the ops use.
    Returns a WarmupReport. Runs without the GIL.
    """
    if tuner is None:
        tuner = Tuner(cache_dir=cache_dir and _os.fspath(cache_dir), mode=mode) if (cache_dir or mode) else current_tuner()
    report = WarmupReport(**tuner._warmup(_workload_text(workload), device))
    if tuner is not current_tuner():
        _C._set_default_tuner(tuner)
    return report


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
    Kernel.launch takes them), or ``{"args": [...], "outputs": [tensors the kernels write]}`` whose outputs are
    compared with the ``reference`` variant's (default: the first) within ``tolerance``. ``check(sizes, args)``
    is your own check after each variant's checked run: False or an exception fails that variant. Compiles and
    benchmarks run without the GIL, the callbacks with it. Returns a kiln.TunedOp (``.chosen``, ``.from_cache``,
    ``.run(args, sizes=None, stream=None)``, ``.report()``).
    """
    sizes = [int(problem_key)] if isinstance(problem_key, int) else [int(s) for s in problem_key]
    return _C._tune_variants(tuner or current_tuner(), op, list(variants), sizes, buffers, check, reference or "",
                             float(tolerance), {str(k): str(v) for k, v in (attributes or {}).items()}, device)


def precompile(workload, arch="sm_90a", cache_dir=None, *, configs=24, executor=None):
    """Compiles every choice of a workload for ``arch`` into the cache, with no GPU (``kiln precompile``).

    Returns a dict: problems, kernels, cached (already there), compiled, failed, failures, seconds, cache_dir.
    Runs without the GIL.
    """
    return _C._precompile(_workload_text(workload), arch, "" if cache_dir is None else _os.fspath(cache_dir),
                          configs, executor or "")


__all__ = [
    "Kernel", "TunedOp", "Tuner", "Variant", "WarmupReport", "autotune", "cache", "compile", "current_tuner", "errors", "gemm",
    "precompile", "rmsnorm", "softmax", "tune", "warmup",
] + errors.__all__
