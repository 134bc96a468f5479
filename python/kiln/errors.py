"""kiln's exceptions: one kiln.KilnError subclass per kiln error code.

Every error carries kiln's own text: ``str(e)`` is the one-line message with its context, and the attributes
``code`` (kiln's code name, e.g. ``"compile error"``), ``message``, ``detail`` (long supporting text such as
NVRTC's log) and ``context`` (what kiln was doing, innermost first).
"""
import builtins


class KilnError(Exception):
    """Base class of every error kiln raises."""

    code = "internal"
    message = ""
    detail = ""
    context = ()


class InvalidArgumentError(KilnError, ValueError):
    """A malformed argument: a bad shape, dtype, layout, mode or workload entry."""


class NotFoundError(KilnError, LookupError):
    """A named thing does not exist (a kernel symbol, a file, a decision in strict mode)."""


class AlreadyExistsError(KilnError):
    pass


class FailedPreconditionError(KilnError):
    """The call is valid but the state is not (no CUDA context, a miss inside graph capture)."""


class CaptureMissError(FailedPreconditionError):
    """A problem was not tuned before CUDA-graph capture and nothing tuned can serve it.

    kiln never tunes, compiles, allocates or synchronises inside a capture. kiln.torch's ops catch this and
    run their torch fallback (except in strict mode); the direct ops raise it.
    """


class OutOfRangeError(KilnError):
    pass


class UnimplementedError(KilnError, NotImplementedError):
    pass


class InternalError(KilnError):
    """A bug in kiln."""


class UnavailableError(KilnError):
    """A resource is temporarily unavailable (a lock held by another process)."""


class CancelledError(KilnError):
    pass


class TimeoutError(KilnError, builtins.TimeoutError):  # noqa: A001 - kiln.TimeoutError is also the builtin
    pass


class CompileError(KilnError):
    """NVRTC rejected the source; its log is in ``detail``."""


class NoDriverError(KilnError):
    """libcuda.so.1 could not be loaded."""


class NoDeviceError(KilnError):
    """The CUDA driver loaded but there is no usable device."""


class CudaError(KilnError):
    """A CUDA driver call failed."""


class LibraryError(KilnError):
    """cuBLAS, NCCL or another library call failed."""


class CorruptError(KilnError):
    """Stored data failed its checks."""


class IoError(KilnError):
    pass


class ShutdownError(KilnError):
    pass


class WorkerCrashedError(KilnError):
    """A compile or benchmark worker process died."""


class WrongResultError(KilnError):
    """A kernel ran but its output does not match the reference."""


# By kiln::ErrorCode value (kiln/status.h), starting at kInvalidArgument = 1.
_BY_CODE = {
    i + 1: cls
    for i, cls in enumerate([
        InvalidArgumentError, NotFoundError, AlreadyExistsError, FailedPreconditionError, OutOfRangeError,
        UnimplementedError, InternalError, UnavailableError, CancelledError, TimeoutError, CompileError,
        NoDriverError, NoDeviceError, CudaError, LibraryError, CorruptError, IoError, ShutdownError,
        WorkerCrashedError, WrongResultError,
    ])
}

__all__ = ["KilnError", "CaptureMissError"] + [cls.__name__ for cls in _BY_CODE.values()]
