"""A library's failed write, as the ``OSError`` it stands for.

Rust-backed libraries (safetensors) report a failed write as an exception of
their own, with the operating system's error only in the message
(``I/O error: No space left on device (os error 28)``). Callers that must
tell a full disk from a bug (a failed snapshot is retried, a bug is not)
need the ``OSError`` with its errno.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

_OS_ERROR_RE: Final = re.compile(r"\(os error (\d+)\)")


def os_error_in(error: Exception, path: Path) -> OSError | None:
    """The ``OSError`` that ``error`` (raised writing ``path``) reports, or None if none.

    None means the library failed for a reason of its own (a bad argument):
    the caller re-raises the original.
    """
    match = _OS_ERROR_RE.search(str(error))
    if match is None:
        return None
    number = int(match.group(1))
    return OSError(number, os.strerror(number), str(path))
