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

from ._C import Kernel, Tuner, compile, current_tuner, gemm, rmsnorm, softmax  # noqa: E402
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


def precompile(workload, arch="sm_90a", cache_dir=None, *, configs=24, executor=None):
    """Compiles every choice of a workload for ``arch`` into the cache, with no GPU (``kiln precompile``).

    Returns a dict: problems, kernels, cached (already there), compiled, failed, failures, seconds, cache_dir.
    Runs without the GIL.
    """
    return _C._precompile(_workload_text(workload), arch, "" if cache_dir is None else _os.fspath(cache_dir),
                          configs, executor or "")


__all__ = [
    "Kernel", "Tuner", "WarmupReport", "autotune", "cache", "compile", "current_tuner", "errors", "gemm",
    "precompile", "rmsnorm", "softmax", "warmup",
] + errors.__all__
