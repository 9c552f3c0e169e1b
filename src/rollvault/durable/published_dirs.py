"""Directories published whole under a fixed name, and replaced whole.

A model directory that a run leaves behind (``final_model/``, the version-0
policy ``bootstrap/policy/``) is written into ``tmp_<name>/`` beside its final
name, optionally given ``file_digests.json`` (the SHA-256 of every file, as a
trainer checkpoint has, checked by
:func:`~rollvault.durable.trainer_checkpoints.verify_trainer_checkpoint`),
flushed file by file, and renamed to ``<name>/``; the parent is flushed after.

A rename cannot replace a non-empty directory, so an existing ``<name>/`` is
first renamed to ``trash_<name>/`` and deleted once the new one is in place.
At every instant ``<name>/`` is therefore absent, the old complete directory or
the new complete one, never a mix. ``tmp_<name>/`` and ``trash_<name>/`` are
never read; the next publication clears them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from rollvault.durable.errors import SnapshotWriteError
from rollvault.durable.faults import fault_point
from rollvault.durable.fsync import _fsync_directory, _fsync_tree
from rollvault.durable.trainer_checkpoints import write_file_digests
from rollvault.durable.trash import remove_tree

__all__ = ["TMP_PREFIX", "TRASH_PREFIX", "publish_directory"]

TMP_PREFIX: Final = "tmp_"
TRASH_PREFIX: Final = "trash_"


def publish_directory(
    final: Path, write: Callable[[Path], None], *, with_digests: bool = False
) -> Path:
    """Publish ``final`` whole: ``write(tmp_dir)`` fills it, then it replaces any old one.

    With ``with_digests``, ``file_digests.json`` records every file ``write``
    wrote. The parent directory is created when missing. On ``OSError`` while
    writing or flushing, the temporary directory is removed, an existing
    ``final`` is untouched, and ``SnapshotWriteError`` is raised.
    """
    parent = final.parent
    tmp = parent / f"{TMP_PREFIX}{final.name}"
    trash = parent / f"{TRASH_PREFIX}{final.name}"
    parent.mkdir(parents=True, exist_ok=True)
    # Leftovers of a publication that was killed: never read, cleared first.
    remove_tree(tmp)
    remove_tree(trash)
    try:
        tmp.mkdir()
        write(tmp)
        if with_digests:
            write_file_digests(tmp)
        _fsync_tree(tmp)
        fault_point("published_dir.tree_synced")
    except OSError as exc:
        remove_tree(tmp)
        raise SnapshotWriteError(
            f"writing {final} failed: {exc}; the partial copy was removed and any "
            f"earlier {final.name} is untouched"
        ) from exc
    except BaseException:
        remove_tree(tmp)
        raise
    if os.path.lexists(final):
        os.rename(final, trash)
        fault_point("published_dir.old_trashed")
    os.rename(tmp, final)
    fault_point("published_dir.after_rename")
    _fsync_directory(parent)
    fault_point("published_dir.parent_synced")
    remove_tree(trash)
    return final
