"""SHA-256 digests of files and of the files of a directory.

Identities that must follow content rather than names (a model directory, a
trainer checkpoint's files) are built from these, so a moved directory keeps
its identity and a file changed in place does not.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Final

__all__ = ["directory_digests", "sha256_file"]

_CHUNK_BYTES: Final = 1 << 20


def sha256_file(path: Path) -> str:
    """SHA-256 (hex) of the file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def directory_digests(root: Path) -> dict[str, str]:
    """``{relative posix path: sha256}`` of every regular file below ``root``.

    Names starting with ``.`` (at any depth) are left out: they are tool
    state (locks, caches), not content. Symlinks are followed to files. An
    empty dict when ``root`` holds no file; ``FileNotFoundError`` when it
    does not exist.
    """
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such directory")
    digests = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file():
            continue
        digests[relative.as_posix()] = sha256_file(path)
    return digests
