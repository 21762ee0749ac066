"""fusebox's exceptions: one class per C API status (include/fusebox/fusebox.h).

Every error the module raises is a ``fusebox.Error``; its ``status`` is the C
API's name for it ("InvalidArgument", ...). ``InvalidArgument`` is also a
``ValueError``, ``OutOfMemory`` a ``MemoryError``.
"""


class Error(Exception):
    """A fusebox failure; ``status`` names its kind, as fusebox_status_name does."""

    status = "Error"
    code = -1


class InvalidArgument(Error, ValueError):
    status, code = "InvalidArgument", 1


class ParseError(Error):
    status, code = "ParseError", 2


class NotSupported(Error):
    status, code = "NotSupported", 3


class IoError(Error):
    status, code = "IoError", 4


class CudnnError(Error):
    status, code = "CudnnError", 5


class CudaError(Error):
    status, code = "CudaError", 6


class NoDevice(Error):
    status, code = "NoDevice", 7


class VersionMismatch(Error):
    status, code = "VersionMismatch", 8


class VerificationFailed(Error):
    status, code = "VerificationFailed", 9


class Internal(Error):
    status, code = "Internal", 10


class OutOfMemory(Error, MemoryError):
    status, code = "OutOfMemory", 11


class LibraryNotFound(Error, ImportError):
    """libfusebox.so could not be found or loaded, or is too old for this module."""

    status = "LibraryNotFound"


BY_CODE = {c.code: c for c in (InvalidArgument, ParseError, NotSupported, IoError, CudnnError, CudaError,
                               NoDevice, VersionMismatch, VerificationFailed, Internal, OutOfMemory)}
