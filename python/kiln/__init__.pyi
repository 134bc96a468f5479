import contextlib
import dataclasses
import os
from typing import Any, Iterator, Optional, Union

from . import cache as cache, errors as errors
from ._C import Kernel as Kernel, Tuner as Tuner, compile as compile, current_tuner as current_tuner
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

def warmup(cache_dir: Optional[Union[str, os.PathLike]] = None, workload: Optional[Workload] = None, *,
           mode: Optional[str] = None, device: int = 0, tuner: Optional[Tuner] = None) -> WarmupReport: ...
def precompile(workload: Workload, arch: str = "sm_90a", cache_dir: Optional[Union[str, os.PathLike]] = None, *,
               configs: int = 24, executor: Optional[str] = None) -> dict[str, Any]: ...
