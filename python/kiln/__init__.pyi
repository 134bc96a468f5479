import contextlib
import dataclasses
import os
from typing import Any, Callable, Iterator, Literal, Optional, Sequence, Union, overload

from . import cache as cache, errors as errors
from ._C import Kernel as Kernel, TunedOp as TunedOp, Tuner as Tuner, compile as compile, current_tuner as current_tuner
from ._C import gemm as gemm, rmsnorm as rmsnorm, softmax as softmax
from .errors import *

__version__: str

Workload = Union[str, os.PathLike, dict, list]

@contextlib.contextmanager
def autotune(tune_mode: bool = True, cache_dir: Optional[str] = None) -> Iterator[Tuner]: ...

@dataclasses.dataclass
class WarmupReport:
    problems: int
    ready: int
    from_cached_decision: int
    tuned: int
    compiled: int
    skipped: int
    failed: int
    seconds: float
    errors: list[str]
    open_seconds: float = 0.0
    fetch_seconds: float = 0.0
    load_seconds: float = 0.0
    threads: int = 0
    taken_by_calls: int = 0
    slowest: list[dict[str, Any]] = ...

class WarmupTask:
    tuner: Tuner
    def __init__(self, tuner: Tuner) -> None: ...
    def done(self) -> bool: ...
    def wait(self) -> WarmupReport: ...

@overload
def warmup(cache_dir: Optional[Union[str, os.PathLike]] = None, workload: Optional[Workload] = None, *,
           mode: Optional[str] = None, device: int = 0, tuner: Optional[Tuner] = None, wait: Literal[True] = True,
           threads: int = 0) -> WarmupReport: ...
@overload
def warmup(cache_dir: Optional[Union[str, os.PathLike]] = None, workload: Optional[Workload] = None, *,
           mode: Optional[str] = None, device: int = 0, tuner: Optional[Tuner] = None, wait: Literal[False],
           threads: int = 0) -> WarmupTask: ...
def precompile(workload: Workload, arch: str = "sm_90a", cache_dir: Optional[Union[str, os.PathLike]] = None, *,
               configs: int = 0, executor: Optional[str] = None) -> dict[str, Any]: ...

@dataclasses.dataclass
class Variant:
    name: str
    source: str
    kernel: str
    grid: Any = 1
    block: Any = 1
    shared_mem: int = 0
    geometry: Optional[Callable[[list[int]], tuple]] = None
    defines: dict[str, Any] = ...
    options: list[str] = ...
    include_dirs: list[str] = ...
    parameters: dict[str, Any] = ...

def tune(variants: Sequence[Variant], problem_key: Union[int, Sequence[int]],
         check: Optional[Callable[[list[int], Any], Any]] = None, *, op: str,
         buffers: Callable[[list[int], int], Any], reference: Optional[str] = None, tolerance: float = 1e-2,
         attributes: Optional[dict[str, str]] = None, device: int = 0, tuner: Optional[Tuner] = None) -> TunedOp: ...
