"""A library's failed write becomes the OSError it reports."""

from __future__ import annotations

import errno
from pathlib import Path

from rollvault.durable.io_errors import os_error_in


def test_the_os_error_in_a_rust_style_message_becomes_an_oserror_naming_the_file() -> None:
    error = RuntimeError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    )
    found = os_error_in(error, Path("/ckpt/rows.safetensors"))
    assert isinstance(found, OSError)
    assert found.errno == errno.ENOSPC
    assert found.filename == "/ckpt/rows.safetensors"
    assert "No space left on device" in str(found)


def test_a_failure_without_an_os_error_is_not_one() -> None:
    assert os_error_in(ValueError("tensor 'a' is not contiguous"), Path("x")) is None
