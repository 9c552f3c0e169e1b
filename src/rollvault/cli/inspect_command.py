"""``rollvault inspect CKPT_DIR [--json]``: what a checkpoint directory holds.

One table per anchor (``bootstrap`` and each trainer checkpoint ``step_<N>``)
with a row per snapshot: age, trainer step, mutation version, rolled-back
groups, ledger groups by status, canonical groups waiting to train, siblings
sealed and in flight, turns committed by in-flight episodes ("7 in 3": seven
turns of three episodes, kept by a restore), staged and train rows, and the
snapshot's own bytes; the bytes of the segments an anchor's snapshots share are
in its title. Reads metadata only (see :mod:`rollvault.checkpoint_tools.inventory`);
a damaged snapshot is shown as such with its problem. ``--json`` prints the same inventory as JSON.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Final

import msgspec
from rich import box
from rich.console import Console, JustifyMethod
from rich.filesize import decimal
from rich.table import Table
from rich.text import Text

from rollvault.checkpoint_tools.inventory import (
    AnchorEntry,
    AnchorKind,
    CheckpointInventory,
    SnapshotContents,
    SnapshotEntry,
    no_run_message,
    take_inventory,
)
from rollvault.durable.bootstrap import holds_run
from rollvault.durable.manifest_schema import RolloutSnapshotManifest
from rollvault.ledger.statuses import PromptGroupStatus

_STATUS_LABELS: Final = {
    PromptGroupStatus.GENERATING: "gen",
    PromptGroupStatus.READY_TO_FINALIZE: "ready",
    PromptGroupStatus.FINALIZING: "fin",
    PromptGroupStatus.FINALIZATION_UNKNOWN: "unknown",
}
_PIPED_WIDTH: Final = 160
_NONE: Final = "-"


def inspect_command(checkpoint_dir: Path, *, as_json: bool) -> int:
    """Run ``rollvault inspect``; returns the exit code (2 when there is no run)."""
    if not checkpoint_dir.is_dir() or not holds_run(checkpoint_dir):
        print(f"rollvault inspect: {no_run_message(checkpoint_dir)}", file=sys.stderr)
        return 2
    inventory = take_inventory(checkpoint_dir, now=time.time())
    if as_json:
        print(msgspec.json.format(msgspec.json.encode(inventory)).decode())
    else:
        render_inventory(inventory, _console())
    return 0


def _console() -> Console:
    console = Console(highlight=False)
    # Piped output would default to 80 columns and wrap every table cell.
    if not console.is_terminal and "COLUMNS" not in os.environ:
        return Console(highlight=False, width=_PIPED_WIDTH)
    return console


def render_inventory(inventory: CheckpointInventory, console: Console) -> None:
    """Print the inventory as text: header, one table per anchor, then problems."""
    root = Path(inventory.checkpoint_dir)

    def say(text: str, style: str = "") -> None:
        # Text, not markup: paths and error messages hold brackets ("$.groups[0]").
        console.print(Text(text, style=style), soft_wrap=True)

    say(f"checkpoint dir {root}", "bold")
    for line, style in _bootstrap_lines(inventory, root):
        say(line, style)
    for anchor in inventory.anchors:
        if anchor.snapshots:
            console.print(_anchor_table(anchor))
        else:
            say(_empty_anchor(anchor))
    for leftover in inventory.leftovers + [p for a in inventory.anchors for p in a.leftovers]:
        say(f"leftover (never read): {_relative(leftover, root)}", "yellow")
    for snapshot in (s for a in inventory.anchors for s in a.snapshots):
        if snapshot.damage is not None:
            where = _relative(snapshot.damage.path, root)
            say(
                f"damaged {_relative(snapshot.path, root)}: {where}: {snapshot.damage.problem}",
                "red",
            )


def _bootstrap_lines(inventory: CheckpointInventory, root: Path) -> list[tuple[str, str]]:
    bootstrap = inventory.bootstrap
    if bootstrap.damage is not None:
        where = _relative(bootstrap.damage.path, root)
        return [(f"bootstrap anchor DAMAGED: {where}: {bootstrap.damage.problem}", "red")]
    per_group = bootstrap.generations_per_group
    return [
        (
            f"bootstrap anchor: compatibility schema {bootstrap.schema_version}, "
            f"{per_group if per_group is not None else '?'} generations per prompt",
            "",
        ),
        (f"  fingerprint {bootstrap.fingerprint}", ""),
    ]


def _anchor_title(anchor: AnchorEntry) -> str:
    name = Path(anchor.path).name
    # A snapshot's own bytes leave out the segments it shares with the others.
    shared_bytes = anchor.shared_segment_bytes
    shared = (
        f"; {decimal(shared_bytes)} of segments shared by its snapshots" if shared_bytes else ""
    )
    if anchor.kind is AnchorKind.BOOTSTRAP:
        return f"{name}/: trainer version 0{shared}"
    state = "MISSING" if anchor.trainer_state_bytes is None else decimal(anchor.trainer_state_bytes)
    return (
        f"{name}/: trainer checkpoint (trainer state {state}; rollout_state is the full "
        f"snapshot taken with it){shared}"
    )


def _empty_anchor(anchor: AnchorEntry) -> str:
    why = (
        " (pruned once a trainer checkpoint exists)" if anchor.kind is AnchorKind.BOOTSTRAP else ""
    )
    return f"{_anchor_title(anchor)}: no rollout snapshots{why}"


_COLUMNS: Final[tuple[tuple[str, JustifyMethod], ...]] = (
    ("snapshot", "left"),
    ("age", "right"),
    ("step", "right"),
    ("mutation\nversion", "right"),
    ("rolled\nback", "right"),
    ("ledger groups", "left"),
    ("canonical\ngroups", "right"),
    ("siblings\nsealed", "right"),
    ("siblings\nin flight", "right"),
    ("turns\ncommitted", "right"),
    ("staged\nrows", "right"),
    ("train\nrows", "right"),
    ("own\nbytes", "right"),
    ("state", "left"),
)


def _anchor_table(anchor: AnchorEntry) -> Table:
    table = Table(
        title=_anchor_title(anchor), title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1)
    )
    for header, justify in _COLUMNS:
        table.add_column(header, justify=justify, no_wrap=True)
    for snapshot in anchor.snapshots:
        table.add_row(*_snapshot_cells(snapshot))
    return table


def _snapshot_cells(snapshot: SnapshotEntry) -> list[str | Text]:
    manifest = snapshot.manifest
    return [
        Text(Path(snapshot.path).name),
        format_age(snapshot.age_s),
        _step(manifest) if manifest else _NONE,
        str(manifest.mutation_version) if manifest else _NONE,
        str(manifest.rolled_back_train_group_count) if manifest else _NONE,
        *_content_cells(snapshot.contents),
        decimal(snapshot.bytes_on_disk),
        Text("ok", style="green") if snapshot.damage is None else Text("DAMAGED", style="red"),
    ]


def _step(manifest: RolloutSnapshotManifest) -> str:
    # Equal for every snapshot the checkpointer writes; both shown if they ever differ.
    if manifest.base_train_step == manifest.trainer_version:
        return str(manifest.base_train_step)
    return f"{manifest.base_train_step}/{manifest.trainer_version}"


def _content_cells(contents: SnapshotContents | None) -> list[str]:
    if contents is None:
        return [_NONE] * 7
    groups = ", ".join(
        f"{count} {_STATUS_LABELS.get(status, status.value)}"
        for status, count in contents.groups_by_status.items()
        if count
    )
    siblings = contents.siblings
    extra = [f"{siblings.failed} failed"] * bool(siblings.failed)
    extra += [f"{siblings.abandoned} abandoned"] * bool(siblings.abandoned)
    return [
        groups or "none",
        str(contents.canonical_groups),
        str(siblings.sealed),
        str(siblings.in_flight) + (f" ({', '.join(extra)})" if extra else ""),
        # Turns kept for in-flight episodes (restore continues there), and how many episodes.
        f"{siblings.turns_committed} in {siblings.mid_episode}" if siblings.mid_episode else "0",
        str(contents.staged_rows),
        str(contents.train_rows),
    ]


def format_age(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``2h03m``, ``4d02h``; ``-`` when unknown."""
    if seconds is None:
        return _NONE
    whole = int(seconds)
    for unit, size, sub, sub_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if whole >= size:
            return f"{whole // size}{unit}{(whole % size) // sub_size:02d}{sub}"
    return f"{whole}s"


def _relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path
