"""Errors raised by the data plane, each naming what is wrong and where."""

from __future__ import annotations

from pathlib import Path


class DataPlaneError(Exception):
    """Base class of every data-plane error."""


class DataPlaneValidationError(DataPlaneError, ValueError):
    """A partition name, key, field or value given to the data plane is malformed."""


class DataPlaneConflictError(DataPlaneError):
    """A put tried to overwrite an existing key with a different row."""


class DataPlaneKeyError(DataPlaneError, KeyError):
    """A requested key is not in its partition."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        # KeyError's own __str__ shows repr(arg), which would quote the message.
        return self.message


class DataPlaneFieldError(DataPlaneKeyError):
    """A requested field is not in a row."""


class DataPlaneStartError(DataPlaneError):
    """The data plane's services (TransferQueue, Ray) could not be started."""


class DataPlaneNotEmptyError(DataPlaneError):
    """A checkpoint was loaded into a data plane that still holds rows."""


class DataPlaneCheckpointError(DataPlaneError):
    """A data-plane checkpoint directory is missing, damaged or does not match its metadata.

    ``path`` is the file (or directory) at fault; ``problem`` says what is wrong.
    """

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem
