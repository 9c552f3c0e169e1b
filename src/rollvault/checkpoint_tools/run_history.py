"""The effective history of a run that was killed and restarted, from its logs.

Each start appends to the same logs. A restore from a snapshot taken when the
run-wide line counter stood at ``S`` rolls back what earlier starts logged
after ``S`` (*void* lines). A restore to a trainer checkpoint also trains
some steps again; for each step, the effective timeline keeps the last start
that trained it. On that timeline the invariants of exactly-once training
are checked (:func:`check_exactly_once`): every expected prompt is trained,
dropped or pending, exactly one of the three, exactly once.

Pending lines (``pending.jsonl``) are what a start that ended by its step
budget left untrained. A start writes them after its final snapshot, so any
later start that restores rolls them back (they are void) and trains those
prompts itself: pending lines count only when no later start rolled them back,
which in practice means only the last start's. A prompt both trained (or
dropped) and pending on the effective timeline is a problem.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from rollvault.controller.loop.run_logs import (
    ATTEMPTS_LOG_FILENAME,
    DROPS_LOG_FILENAME,
    PENDING_LOG_FILENAME,
    RESTORES_LOG_FILENAME,
    TRAIN_LOG_FILENAME,
    TURNS_LOG_FILENAME,
    AttemptLogRecord,
    DropLogRecord,
    PendingLogRecord,
    RestoreLogRecord,
    TrainLogRecord,
    TurnLogRecord,
    read_jsonl,
)
from rollvault.ledger.statuses import RolloutAttemptStatus

PromptKey = tuple[int, str]
"""(epoch, sample id): one prompt of one epoch."""


@dataclass
class RunHistory:
    """A run's logs, with void lines marked and each step's effective training."""

    train: list[TrainLogRecord]
    drops: list[DropLogRecord]
    attempts: list[AttemptLogRecord]
    restores: list[RestoreLogRecord]
    pending: list[PendingLogRecord] = field(default_factory=list)
    turns: list[TurnLogRecord] = field(default_factory=list)
    """Committed turns of multi-turn attempts (``turns.jsonl``)."""
    steps: dict[int, list[TrainLogRecord]] = field(default_factory=dict)
    """Per step, the groups of the last start that trained it."""
    superseded: dict[int, list[list[TrainLogRecord]]] = field(default_factory=dict)
    """Per step trained more than once, the earlier (rolled back) trainings."""

    def is_void(self, incarnation: int, seq: int) -> bool:
        """Whether a line was rolled back by a later start's restore."""
        return any(
            restore.incarnation > incarnation and seq > restore.restored_seq
            for restore in self.restores
        )


def read_run_history(log_dir: Path) -> RunHistory:
    """Read every log of the run in ``log_dir`` and build its effective timeline."""
    history = RunHistory(
        train=read_jsonl(log_dir / TRAIN_LOG_FILENAME, TrainLogRecord),
        drops=read_jsonl(log_dir / DROPS_LOG_FILENAME, DropLogRecord),
        attempts=read_jsonl(log_dir / ATTEMPTS_LOG_FILENAME, AttemptLogRecord),
        restores=read_jsonl(log_dir / RESTORES_LOG_FILENAME, RestoreLogRecord),
        pending=read_jsonl(log_dir / PENDING_LOG_FILENAME, PendingLogRecord),
        turns=read_jsonl(log_dir / TURNS_LOG_FILENAME, TurnLogRecord),
    )
    by_step: dict[int, dict[int, list[TrainLogRecord]]] = defaultdict(lambda: defaultdict(list))
    for record in history.train:
        if not history.is_void(record.incarnation, record.seq):
            by_step[record.step][record.incarnation].append(record)
    for step, starts in sorted(by_step.items()):
        ordered = [starts[incarnation] for incarnation in sorted(starts)]
        history.steps[step] = ordered[-1]
        if len(ordered) > 1:
            history.superseded[step] = ordered[:-1]
    return history


def effective_drops(history: RunHistory) -> list[DropLogRecord]:
    """Drops that no restore rolled back."""
    return [d for d in history.drops if not history.is_void(d.incarnation, d.seq)]


def effective_pending(history: RunHistory) -> list[PendingLogRecord]:
    """Pending lines that no later start's restore rolled back."""
    return [p for p in history.pending if not history.is_void(p.incarnation, p.seq)]


def effective_trained(history: RunHistory) -> list[TrainLogRecord]:
    """The trained groups of the effective timeline, step by step."""
    return [record for _, records in sorted(history.steps.items()) for record in records]


@dataclass(frozen=True)
class EpochAccount:
    """One epoch's expected prompts and what became of them on the effective timeline."""

    epoch: int
    expected: int
    trained: int
    dropped: int
    pending: int

    @property
    def unaccounted(self) -> int:
        """Expected prompts that are none of trained, dropped or pending (at least 0)."""
        return max(0, self.expected - self.trained - self.dropped - self.pending)


def epoch_accounts(history: RunHistory, expected: set[PromptKey]) -> list[EpochAccount]:
    """Per epoch (every epoch expected or seen), expected prompts trained, dropped, pending."""
    trained = Counter(
        r.epoch for r in effective_trained(history) if (r.epoch, r.sample_id) in expected
    )
    dropped = Counter(
        d.epoch for d in effective_drops(history) if (d.epoch, d.sample_id) in expected
    )
    pending = Counter(
        p.epoch for p in effective_pending(history) if (p.epoch, p.sample_id) in expected
    )
    wanted = Counter(epoch for epoch, _ in expected)
    epochs = sorted(set(wanted) | set(trained) | set(dropped) | set(pending))
    return [
        EpochAccount(
            epoch=epoch,
            expected=wanted[epoch],
            trained=trained[epoch],
            dropped=dropped[epoch],
            pending=pending[epoch],
        )
        for epoch in epochs
    ]


def epochs_reached(history: RunHistory) -> int:
    """How many epochs the effective timeline reached: 1 + the highest epoch any
    trained, dropped or pending line names (0: none). For a run that ended by its
    step budget, whose later epochs were never drawn."""
    epochs = [r.epoch for r in effective_trained(history)]
    epochs += [d.epoch for d in effective_drops(history)]
    epochs += [p.epoch for p in effective_pending(history)]
    return max(epochs, default=-1) + 1


def check_exactly_once(history: RunHistory, expected: set[PromptKey]) -> list[str]:
    """Every problem with exactly-once training on the effective timeline (empty: none).

    ``expected`` is every (epoch, sample id) the run should have consumed.
    Checks: each expected prompt trained exactly once, dropped or pending,
    exactly one of the three; nothing unexpected trained; no group trained
    twice; a step trained again has the same prompts; each group restored
    finalized trained as itself.
    """
    problems: list[str] = []
    trained = effective_trained(history)
    outcomes: dict[PromptKey, list[str]] = defaultdict(list)
    for record in trained:
        outcomes[(record.epoch, record.sample_id)].append("trained")
    for drop in effective_drops(history):
        outcomes[(drop.epoch, drop.sample_id)].append("dropped")
    for pending in effective_pending(history):
        outcomes[(pending.epoch, pending.sample_id)].append(f"pending ({pending.reason.value})")
    for key in sorted(expected | set(outcomes)):
        found = outcomes.get(key, [])
        if key not in expected:
            problems.append(f"prompt {key} was {' and '.join(found)} but not expected")
        elif not found:
            problems.append(f"prompt {key} was not trained, dropped or pending: it was lost")
        elif len(found) != 1:
            problems.append(f"prompt {key} was {', '.join(found)}: {len(found)} outcomes, not 1")
    group_counts = Counter(record.group_id for record in trained)
    problems += [f"group {g} trained {n} times" for g, n in group_counts.items() if n > 1]
    for step, earlier in history.superseded.items():
        final = {(r.epoch, r.sample_id) for r in history.steps[step]}
        for records in earlier:
            if {(r.epoch, r.sample_id) for r in records} != final:
                problems.append(f"step {step} trained different prompts after a restore")
    trained_groups = {record.group_id for record in trained}
    for restore in history.restores:
        missing = [g for g in restore.canonical_group_ids if g not in trained_groups]
        if missing:
            problems.append(
                f"start {restore.incarnation} restored finalized groups {missing[:5]} "
                "that did not train as themselves"
            )
    return problems


def check_sibling_reuse(history: RunHistory) -> list[str]:
    """Each sibling of each trained group sealed exactly once, net of discarded seals.

    With ``sibling`` granularity and no transient failures this means no
    sibling sealed before the snapshot a restore used was generated again.
    """
    net: Counter[tuple[str, int]] = Counter()
    for attempt in history.attempts:
        if history.is_void(attempt.incarnation, attempt.seq):
            continue
        key = (attempt.group_id, attempt.generation_index)
        if attempt.status is RolloutAttemptStatus.SEALED:
            net[key] += 1
        elif attempt.status is RolloutAttemptStatus.ABANDONED:
            net[key] -= 1
    problems = []
    for records in history.steps.values():
        for record in records:
            for index in range(len(record.gate_rollout_ids)):
                count = net[(record.group_id, index)]
                if count != 1:
                    problems.append(
                        f"group {record.group_id} sibling {index} has {count} effective seals"
                    )
    return problems


def check_turn_lineage(history: RunHistory) -> list[str]:
    """Each trained episode is exactly its committed turns, each generated once.

    For every sibling of every trained group, the turns its published attempt
    lists (``attempts.jsonl``: its receipt's keys) must be exactly the turns
    committed for that sibling on the effective timeline (``turns.jsonl``, void
    lines left out), in order. So no committed turn was generated twice (a
    regenerated turn is one more line), and an episode a restore continued
    kept its committed prefix (the prefix is in its receipt). Each restore's
    resumed prefix must begin the trained episode too. Valid with ``sibling``
    granularity and no simulated failures (a failed attempt's turns are redone);
    an episode a restore restarted from its first turn (``restart_only``, or
    ``rollout.turn_level_restore=false``) regenerates its turns by design and is
    left out.
    """
    restarted = {
        line.split(":", 1)[0] for restore in history.restores for line in restore.episodes_restarted
    }
    sealed = {
        a.gate_rollout_id: a
        for a in history.attempts
        if a.status is RolloutAttemptStatus.SEALED and not history.is_void(a.incarnation, a.seq)
    }
    committed: dict[tuple[str, int], list[str]] = defaultdict(list)
    for turn in history.turns:
        if not history.is_void(turn.incarnation, turn.seq):
            committed[(turn.group_id, turn.generation_index)].append(turn.staging_key)
    problems = []
    trained: dict[str, list[str]] = {}
    for records in history.steps.values():
        for record in records:
            for index, gate_rollout_id in enumerate(record.gate_rollout_ids):
                attempt = sealed.get(gate_rollout_id)
                if attempt is None or attempt.staging_keys is None:
                    continue  # a line of an older version: nothing to compare
                keys = committed.get((record.group_id, index), [])
                logical = f"{record.group_id}_g{index}"
                trained[logical] = attempt.staging_keys
                if keys and keys != attempt.staging_keys and logical not in restarted:
                    problems.append(
                        f"group {record.group_id} sibling {index}: trained turns "
                        f"{attempt.staging_keys} but committed {keys} (a turn generated twice, "
                        "or a committed prefix lost)"
                    )
    for restore in history.restores:
        for logical, prefix in restore.episodes_resumed.items():
            episode = trained.get(logical)
            if episode is not None and episode[: len(prefix)] != prefix:
                problems.append(
                    f"start {restore.incarnation} continued {logical} from {prefix}, but it "
                    f"trained as {episode}"
                )
    return problems


@dataclass(frozen=True)
class WorkAccounting:
    """Tokens generated (sealed attempts, every start) against tokens that trained."""

    generated_tokens: int
    trained_tokens: int

    @property
    def lost_tokens(self) -> int:
        return self.generated_tokens - self.trained_tokens


def work_accounting(history: RunHistory) -> WorkAccounting:
    """Generated tokens count every sealed attempt ever logged, rolled back or not.

    An attempt a restore adopted from the seal journal generated nothing: its
    tokens are those of the attempt it names (``adopted_from``), which trained.
    """
    sealed = [a for a in history.attempts if a.status is RolloutAttemptStatus.SEALED]
    tokens = {a.gate_rollout_id: a.num_tokens for a in sealed if a.adopted_from is None}
    generated_as = {a.gate_rollout_id: a.adopted_from for a in sealed if a.adopted_from}
    trained = sum(
        tokens.get(generated_as.get(rollout_id, rollout_id), 0)
        for records in history.steps.values()
        for record in records
        for rollout_id in record.gate_rollout_ids
    )
    return WorkAccounting(generated_tokens=sum(tokens.values()), trained_tokens=trained)
