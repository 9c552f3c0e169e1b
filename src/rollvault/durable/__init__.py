"""Durable files: the filesystem contract of rollout snapshots.

The bottom layer of rollvault; it uses the standard library and msgspec only
and knows nothing of the ledger or the data plane. One job per module:

- ``layout``: names of the directories and files on disk.
- ``errors``: the ``SnapshotError`` family every failure here raises.
- ``faults``: the explicit fault-injection hook the crash tests kill at.
- ``fsync``: flushing files, directories and trees; small atomic writes.
- ``trash``: deleting ``tmp_``/``trash_`` trees that are never read again.
- ``manifest_schema``: the versioned, strictly decoded snapshot manifest.
- ``snapshot_dirs``: sequence numbers, tmp/final paths, commit and retention.
- ``publish``: prepare, write, commit in one call, cleaning up on failure.
- ``config_paths``: config trees as JSON data, dotpaths and path patterns.
- ``compatibility``: the run's compatibility identity and its fingerprint.
- ``bootstrap``: the trainer-version-zero anchor.
- ``resolve``: choosing the newest usable committed snapshot.
- ``trainer_checkpoints``: ``step_<N>/`` directories and their file digests.
- ``published_dirs``: directories published and replaced whole (the final model).
- ``journal_format``: CRC-framed record segments of an append-only journal, read back
  up to the first torn or damaged record.
- ``journal_writer``: appending to a journal with group commit on a writer thread;
  repair, rotation and dropping the segments a snapshot covers.
- ``journal_process``: the same writer in a child process of its own, fed bytes over a
  pipe (the seal journal's default: the caller's interpreter does none of the writing).

The spec-facing names are re-exported by
:mod:`rollvault.rollout_checkpointing.manifest`.
"""
