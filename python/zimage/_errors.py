"""zimage's exceptions: one class per engine error code, all under zimage.Error.

Every error the engine reports arrives as one of these, carrying the engine's message and, when
the error is about one argument, its name in ``.field`` ("width", "prompts[0]", "init_image").
"""

from __future__ import annotations


class Error(Exception):
    """An error reported by zimage. ``.code``: the engine's error code ("invalid_argument", ...);
    ``.field``: the argument at fault, or ``None``; ``.message``: the engine's message."""

    code = "internal"

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field or None


class InvalidArgument(Error, ValueError):
    """A bad argument or request field (``.field`` names it)."""

    code = "invalid_argument"


class NotFound(Error, LookupError):
    """A missing file, folder, tensor or config key."""

    code = "not_found"


class IOFailure(Error, OSError):
    """Reading or writing a file failed."""

    code = "io"


class FormatError(Error, ValueError):
    """A file exists but its contents are malformed."""

    code = "format"


class Unsupported(Error):
    """Well-formed, but not something the engine can do here (e.g. device="cuda" without a GPU)."""

    code = "unsupported"


class OutOfMemory(Error, MemoryError):
    """A host or device allocation failed."""

    code = "out_of_memory"


class DeviceError(Error, RuntimeError):
    """A CUDA / cuBLAS / cuDNN call failed."""

    code = "device"


class Cancelled(Error):
    """The call was stopped: ``on_step`` returned False or raised zimage.Cancelled."""

    code = "cancelled"


class InternalError(Error, RuntimeError):
    """An invariant the engine itself broke (a bug: please report it)."""

    code = "internal"


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, IOFailure, FormatError,
                                      Unsupported, OutOfMemory, DeviceError, Cancelled,
                                      InternalError)}


def from_status(code: str, message: str, field: str = "") -> Error:
    """The exception for an engine status (called by the native module)."""
    return _BY_CODE.get(code, InternalError)(message, field or None)


def invalid(field: str, detail: str) -> InvalidArgument:
    """An InvalidArgument about ``field``, worded as the engine words its own."""
    return InvalidArgument(f"{field}: {detail}", field)
