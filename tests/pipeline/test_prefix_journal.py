"""Token-prefix resume on the controller side, in-process: journal, replay, carry, mask, config.

The end-to-end proof (a SIGKILL through ``rollvault run``) is in
tests/chaos/test_chaos_prefix_resume.py; the gate's side in
tests/gates/test_gates_prefix_resume.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from pipeline_helpers import dataset_of, small_config

from rollvault.config.errors import ConfigError
from rollvault.config.loading import load_run_config
from rollvault.config.schema import PrefixResume, RunConfig
from rollvault.controller.loop.gate import PartialTurn
from rollvault.controller.loop.journal_rows import SealJournalRecordError
from rollvault.controller.loop.partials import (
    carry_live_partials,
    resume_with_prefix,
    stale_mask,
)
from rollvault.controller.loop.parts import GroupOrigin, RolloutParts
from rollvault.controller.loop.pipeline import build_parts
from rollvault.controller.loop.seal_journal import (
    SEAL_JOURNAL_DIRNAME,
    JournalEnvelope,
    PartialRecord,
    SealJournal,
    StepRecord,
    decode_entry,
    decode_replay,
    encode_entry,
)
from rollvault.controller.snapshots.journal_replay import (
    JournalReplayCounts,
    adopt_journaled_partials,
    replay_seal_journal,
)
from rollvault.controller.snapshots.resume import run_fingerprint
from rollvault.durable.journal_format import list_segments
from rollvault.ledger.records import PromptGroupRecoveryRecord


def _config(tmp_path: Path, *overrides: str) -> RunConfig:
    return small_config(tmp_path, "grpo.num_generations_per_prompt=2", *overrides)


def _partial(
    record: PromptGroupRecoveryRecord,
    index: int,
    tokens: list[int],
    *,
    attempt: str | None = None,
    turn: int = 0,
    dataset_idx: int = 0,
) -> PartialRecord:
    rollout_id = record.gate_rollout_id(index)
    if attempt is not None:
        rollout_id = f"{rollout_id.rsplit('_a', 1)[0]}_a{attempt}"
    return PartialRecord(
        group_id=record.group_id,
        generation_index=index,
        gate_rollout_id=rollout_id,
        epoch=0,
        dataset_idx=dataset_idx,
        target_step=record.target_step,
        turn_index=turn,
        token_ids=tokens,
        logprobs=[-0.25] * len(tokens),
        weight_versions=list(range(len(tokens))),
        seed_id=rollout_id,
    )


async def _dispatched_group(parts: RolloutParts, dataset_idx: int = 0) -> PromptGroupRecoveryRecord:
    async with parts.cut.mutation():
        record = parts.ledger.reserve_group(
            parts.cut,
            prompt_id=str(dataset_idx),
            prompt_payload=parts.dataset[dataset_idx],
            expected_generations=2,
            target_step=0,
            start_weight_version=0,
        )
        parts.add_reserved_group(record.group_id, GroupOrigin(epoch=0, dataset_idx=dataset_idx))
        parts.ledger.mark_group_dispatched(parts.cut, record.group_id, generation_indices=[0, 1])
    return parts.ledger.get_group(record.group_id)


def _journal(config: RunConfig) -> SealJournal:
    directory = Path(config.checkpointing.checkpoint_dir)
    return SealJournal.open(directory, config.rollout_checkpointing.journal)


async def _replay(parts: RolloutParts, config: RunConfig, from_seq: int = 0) -> JournalReplayCounts:
    journal = _journal(config)
    try:
        async with parts.cut.mutation():
            return await replay_seal_journal(parts, journal, from_seq=from_seq)
    finally:
        journal.close()


async def _retried(parts: RolloutParts, record: PromptGroupRecoveryRecord, index: int) -> str:
    """Fail sibling ``index``'s attempt and retry it; returns the failed attempt's hex id."""
    failed = record.siblings[index].current_attempt.attempt_id
    async with parts.cut.mutation():
        parts.ledger.mark_sibling_failed(
            parts.cut,
            record.group_id,
            generation_index=index,
            gate_rollout_id=record.gate_rollout_id(index),
            reason="test: a retried attempt",
        )
        parts.ledger.prepare_incomplete_retry(parts.cut, record.group_id)
        parts.ledger.mark_group_dispatched(parts.cut, record.group_id, generation_indices=[index])
    return failed


def test_replay_gives_the_newest_partial_to_its_live_attempt_only(tmp_path: Path) -> None:
    config = _config(tmp_path)

    async def main() -> None:
        parts = build_parts(config, dataset=dataset_of(config))
        record = await _dispatched_group(parts)
        failed = await _retried(parts, record, 1)
        journal = _journal(config)
        journal.partial(_partial(record, 0, [5, 6]))
        journal.partial(_partial(record, 0, [5, 6, 7, 8]))  # cumulative: this one counts
        # The retried (older) attempt's: fenced off, a retry starts afresh.
        journal.partial(_partial(record, 1, [9, 9], attempt=failed))
        journal.close()
        counts = await _replay(parts, config)
        key = f"{record.group_id}_g0"
        assert list(parts.partials.resumed) == [key]
        assert parts.partials.resumed[key].token_ids == [5, 6, 7, 8]
        assert parts.partials.resumed[key].weight_versions == [0, 1, 2, 3]
        assert counts.partials_matched == 1
        assert counts.partials_unmatched == 1

    asyncio.run(main())


def test_a_partial_of_an_attempt_minted_after_the_snapshot_goes_to_its_sibling(
    tmp_path: Path,
) -> None:
    """A restart killed before its first snapshot minted the attempt: the ledger never saw it."""
    config = _config(tmp_path)

    async def main() -> None:
        parts = build_parts(config, dataset=dataset_of(config))
        record = await _dispatched_group(parts)
        journal = _journal(config)
        journal.partial(_partial(record, 0, [5, 6]))  # the snapshot's attempt's
        unknown = "ab" * 16
        journal.partial(_partial(record, 0, [5, 6, 7], attempt=unknown))  # the restart's
        journal.partial(_partial(record, 1, [9], attempt=unknown, turn=1))  # turn 0 uncommitted
        stale = _partial(record, 1, [8], attempt="cd" * 16)
        journal.partial(msgspec.structs.replace(stale, target_step=1))  # another step's
        journal.close()
        counts = await _replay(parts, config)
        assert {key: p.token_ids for key, p in parts.partials.resumed.items()} == {
            f"{record.group_id}_g0": [5, 6, 7]
        }
        assert (counts.partials_matched, counts.partials_unmatched) == (2, 2)

    asyncio.run(main())


def test_a_torn_partial_is_cut_off_and_the_one_before_it_resumes(tmp_path: Path) -> None:
    config = _config(tmp_path)

    async def main() -> None:
        parts = build_parts(config, dataset=dataset_of(config))
        record = await _dispatched_group(parts)
        journal = _journal(config)
        journal.partial(_partial(record, 0, [5, 6]))
        journal.partial(_partial(record, 0, [5, 6, 7, 8]))
        journal.close()
        directory = Path(config.checkpointing.checkpoint_dir) / SEAL_JOURNAL_DIRNAME
        segment = list_segments(directory)[-1][1]
        segment.write_bytes(segment.read_bytes()[:-5])  # tear the newest record
        counts = await _replay(parts, config)
        assert counts.damage is not None
        assert parts.partials.resumed[f"{record.group_id}_g0"].token_ids == [5, 6]

    asyncio.run(main())


def test_a_partial_of_a_turn_that_committed_is_ignored(tmp_path: Path) -> None:
    config = _config(tmp_path)

    async def main() -> None:
        parts = build_parts(config, dataset=dataset_of(config))
        record = await _dispatched_group(parts)
        async with parts.cut.mutation():
            parts.ledger.commit_turn(
                parts.cut,
                record.group_id,
                generation_index=0,
                gate_rollout_id=record.gate_rollout_id(0),
                staging_key=f"{record.gate_rollout_id(0)}_c0",
                turn_index=0,
            )
        journal = _journal(config)
        journal.partial(_partial(record, 0, [5, 6], turn=0))
        journal.close()
        counts = await _replay(parts, config)
        assert parts.partials.resumed == {}
        assert counts.partials_unmatched == 1

    asyncio.run(main())


def test_a_lost_groups_partial_goes_to_its_prompts_next_group(tmp_path: Path) -> None:
    config = _config(tmp_path)

    async def main() -> None:
        parts = build_parts(config, dataset=dataset_of(config))
        lost = await _dispatched_group(parts, dataset_idx=3)
        journal = _journal(config)
        journal.partial(_partial(lost, 1, [7, 7, 7], dataset_idx=3))
        journal.close()
        restored = build_parts(config, dataset=dataset_of(config))  # the lost group is not in it
        counts = await _replay(restored, config)
        assert counts.partials_pooled == 1
        again = await _dispatched_group(restored, dataset_idx=3)
        async with restored.cut.mutation():
            assert adopt_journaled_partials(restored, again.group_id, sealed=set()) == 1
        assert restored.partials.resumed[f"{again.group_id}_g1"].token_ids == [7, 7, 7]
        assert restored.partials.pooled == {}

    asyncio.run(main())


def test_a_snapshots_rotation_keeps_the_partials_of_live_attempts_only(tmp_path: Path) -> None:
    config = _config(tmp_path)

    async def main() -> None:
        parts = build_parts(config, dataset=dataset_of(config))
        record = await _dispatched_group(parts)
        live = _partial(record, 0, [1, 2])
        ended = _partial(record, 1, [3, 4], attempt="f" * 32)
        journal = _journal(config)
        for partial in (live, ended):
            journal.partial(partial)
            parts.partials.record(partial)
        snapshot_seq = journal.next_seq  # the snapshot is taken here and commits
        journal.carry_partials(carry_live_partials(parts.partials, parts.ledger))
        journal.covered(snapshot_seq)
        journal.close()
        assert list(parts.partials.live) == [live.gate_rollout_id]
        reopened = _journal(config)
        kept = [r.entry for r in decode_replay(reopened.repair.replay) if r.seq >= snapshot_seq]
        reopened.close()
        assert kept == [live]

    asyncio.run(main())


def test_mask_stale_masks_exactly_the_tokens_older_than_the_staleness_limit(
    tmp_path: Path,
) -> None:
    prefix = PartialTurn(
        turn_index=0,
        token_ids=[1, 2, 3, 4, 5],
        logprobs=[-1.0] * 5,
        weight_versions=[0, 1, 2, 3, 4],
        seed_id="x",
    )
    in_order = _config(tmp_path, "sampler.max_lookahead_versions=1")
    # in_order: a group stamped for step 4 may train tokens of versions >= 3.
    assert stale_mask(in_order, prefix, version_now=4) is None  # prefix_resume=off
    masked = msgspec_replace_rollout(in_order, "mask_stale")
    assert stale_mask(masked, prefix, version_now=4) == [0, 0, 0, 1, 1]
    windowed = msgspec_replace_rollout(
        _config(tmp_path, "sampler.kind=windowed", "sampler.max_staleness_versions=2"),
        "mask_stale",
    )
    assert stale_mask(windowed, prefix, version_now=4) == [0, 0, 1, 1, 1]
    assert stale_mask(msgspec_replace_rollout(in_order, "keep"), prefix, version_now=4) is None

    async def dispatch() -> None:
        parts = build_parts(masked, dataset=dataset_of(masked))
        record = await _dispatched_group(parts)
        parts.partials.resumed[f"{record.group_id}_g0"] = prefix
        resume = resume_with_prefix(masked, parts.partials, record, 0, None, trainer_version=4)
        # The group is stamped for step 0: every version >= 0 is within the limit.
        assert resume is not None and resume.partial == prefix
        assert resume.partial_mask == [1, 1, 1, 1, 1]
        assert parts.partials.resumed == {} and parts.partials.tokens_resumed == 5
        # Taken once: a retry of the sibling starts its turn afresh.
        assert (
            resume_with_prefix(masked, parts.partials, record, 0, None, trainer_version=4) is None
        )

    asyncio.run(dispatch())


def msgspec_replace_rollout(config: RunConfig, mode: str) -> RunConfig:
    """``config`` with ``rollout.prefix_resume=mode`` (bypassing the gate rule: no gate here)."""
    return msgspec.structs.replace(
        config, rollout=msgspec.structs.replace(config.rollout, prefix_resume=PrefixResume(mode))
    )


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (("rollout.prefix_resume=keep",), "rollout.prefix_resume=keep needs a gate"),
        (("rollout.prefix_resume=sometimes",), "rollout.prefix_resume"),
        (("rollout.prefix_resume_tokens=0",), "rollout.prefix_resume_tokens"),
        (
            (
                "gate.kind=local_model",
                "trainer.kind=grpo",
                "rollout.prefix_resume=mask_stale",
                "rollout.recovery_granularity=prompt_group",
            ),
            "recovery_granularity=prompt_group",
        ),
    ],
)
def test_bad_prefix_resume_config_names_the_field(
    tmp_path: Path, overrides: tuple[str, ...], named: str
) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_run_config(None, list(overrides))


def test_off_is_a_string_in_overrides_and_both_fields_are_in_the_runs_identity(
    tmp_path: Path,
) -> None:
    off = load_run_config(None, ["rollout.prefix_resume=off"])
    assert off.rollout.prefix_resume.value == "off"
    base = ["gate.kind=local_model", "trainer.kind=grpo"]
    # Fail closed: the chunks' seeds decide the sampled tokens, and the mode what trains.
    fingerprints = {
        run_fingerprint(load_run_config(None, [*base, *extra]))
        for extra in (
            [],
            ["rollout.prefix_resume=keep"],
            ["rollout.prefix_resume=mask_stale"],
            ["rollout.prefix_resume=keep", "rollout.prefix_resume_tokens=32"],
        )
    }
    assert len(fingerprints) == 4


def test_a_partial_record_is_versioned_on_its_own_and_a_wrong_version_is_refused() -> None:
    partial = PartialRecord(
        group_id="g",
        generation_index=0,
        gate_rollout_id="g_g0_a" + "1" * 32,
        epoch=0,
        dataset_idx=0,
        target_step=0,
        turn_index=0,
        token_ids=[1],
        logprobs=[-1.0],
        weight_versions=[0],
        seed_id="s",
    )
    assert decode_entry(encode_entry(partial), where="here") == partial
    # A seal, finalization or step keeps version 1: journals without partials read as before.
    step = StepRecord(trainer_version=1, group_ids=[])
    assert msgspec.msgpack.decode(encode_entry(step))["schema_version"] == 1
    wrong = msgspec.msgpack.encode(JournalEnvelope(schema_version=1, entry=partial))
    with pytest.raises(SealJournalRecordError, match="here: .*version 1 for a PartialRecord"):
        decode_entry(wrong, where="here")
