"""Where the tokens a run lost went, kill by kill, from its logs and the kills' evidence.

Every sealed attempt that generated tokens (``attempts.jsonl``, not adopted
from the seal journal) and never reached training is *lost*. Each is charged
to the kill that ended its start and sorted by what that kill left on disk
(:mod:`.kill_evidence`):

- **not durable**: its seal was neither in the seal journal on disk nor in
  the newest committed snapshot (sealed within the last commit interval, or
  the journal is off): nothing can keep it;
- **dropped**: durable, but its prompt was dropped (the retry budget gave it
  up) with it, or a drop displaced it: a dropped group's replacement takes the
  next prompt at the dropped group's target step, so that prompt (and each
  later one that moves across a step boundary) is reserved again at another
  target step than its lost group's, and a journaled seal is adopted only at
  the target step it was stamped for
  (:mod:`~rollvault.controller.snapshots.journal_replay`);
- **durable, lost**: durable and still generated again: what DESIGN
  invariant 10 forbids for a run with the journal on (a ``trainer_checkpoint``
  restore loses these by design): a harness problem where the journal
  promises it (:func:`durable_loss_problems`);
- **after the last kill**: sealed by the start that finished (a prompt dropped
  then, or ``prompt_group`` discarding its siblings).

The attempts in flight at each kill (each counted at the first kill that names
it: one a kill interrupted stays unreturned on disk until a snapshot records
its charge) lost their tokens too, though no log
counts them: each is measured by the tokens of the attempt that redid its
sibling (the same sibling of the same group, or of the prompt's next group
when the group was lost with the process); one never redone (its prompt
dropped) counts the mean sealed attempt. A redo's full length bounds what the
interrupted attempt had generated, so ``in_flight_tokens`` is an upper bound
of the in-flight work; its half is the usual estimate of it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rollvault.checkpoint_tools.chaos.kill_evidence import InFlightAttempt, KillEvidence
from rollvault.checkpoint_tools.run_history import RunHistory
from rollvault.config.schema import RecoveryGranularity, RestoreMode, RunConfig
from rollvault.controller.loop.run_logs import AttemptLogRecord
from rollvault.ledger.statuses import RolloutAttemptStatus


@dataclass
class KillLoss:
    """The tokens one kill cost, by kind."""

    start: int
    in_flight_attempts: int = 0
    in_flight_tokens: int = 0
    in_flight_unmatched: int = 0
    """In-flight attempts never redone, counted at the mean sealed length."""
    not_durable_tokens: int = 0
    not_durable_seals: int = 0
    dropped_tokens: int = 0
    dropped_seals: int = 0
    durable_lost_tokens: int = 0
    durable_lost: list[str] = field(default_factory=list)
    """Gate rollout ids of the durable seals generated again."""


@dataclass
class LossAccount:
    """A run's lost tokens, per kill and in total."""

    kills: list[KillLoss]
    after_last_kill_tokens: int = 0
    """Lost seals of the start that finished."""
    problems: list[str] = field(default_factory=list)

    def total(self, name: str) -> int:
        """The sum of one :class:`KillLoss` counter over the kills."""
        return sum(int(getattr(kill, name)) for kill in self.kills)

    @property
    def sealed_lost_tokens(self) -> int:
        """Tokens of sealed attempts that never trained (the logged loss)."""
        kinds = ("not_durable_tokens", "dropped_tokens", "durable_lost_tokens")
        return sum(self.total(name) for name in kinds) + self.after_last_kill_tokens

    @property
    def total_lost_tokens(self) -> int:
        """Sealed tokens lost plus the in-flight attempts' (their redo's length)."""
        return self.sealed_lost_tokens + self.total("in_flight_tokens")

    @property
    def physical_limit_tokens(self) -> int:
        """What no journal can keep: in flight, or sealed but not yet durable, at a kill."""
        return self.total("in_flight_tokens") + self.total("not_durable_tokens")

    def limit_ratio(self, in_flight_share: float = 1.0) -> float:
        """Total lost / the physical limit, with in-flight tokens scaled by ``in_flight_share``.

        1.0 counts an interrupted attempt at its redo's full length (an upper
        bound); 0.5 at half of it (half done at the kill, on average).
        """
        in_flight = in_flight_share * self.total("in_flight_tokens")
        limit = in_flight + self.total("not_durable_tokens")
        lost = in_flight + self.sealed_lost_tokens
        return lost / limit if limit else float("inf") if lost else 1.0


def loss_account(history: RunHistory, evidence: Sequence[KillEvidence]) -> LossAccount:
    """Sort every lost token of the run by the kill that lost it (see the module docstring)."""
    attempts = history.attempts
    sealed = [a for a in attempts if a.status is RolloutAttemptStatus.SEALED]
    tokens = {a.gate_rollout_id: a.num_tokens for a in sealed if a.adopted_from is None}
    trained = _trained_rollout_ids(history, sealed)
    dropped = _dropped_rollout_ids(history, sealed, evidence)
    dropped |= _displaced_rollout_ids(history, sealed, evidence)
    by_incarnation = {kill.incarnation: kill for kill in evidence}
    account = LossAccount(kills=[KillLoss(start=kill.start) for kill in evidence])
    losses = {kill.incarnation: loss for kill, loss in zip(evidence, account.kills, strict=True)}
    account.problems = [kill.problem for kill in evidence if kill.problem]
    charged: set[str] = set()
    for attempt in sealed:
        if attempt.adopted_from is not None or attempt.gate_rollout_id in trained:
            continue
        if attempt.gate_rollout_id in charged:
            continue  # a replay's line for the same attempt: it generated nothing
        charged.add(attempt.gate_rollout_id)
        kill = by_incarnation.get(attempt.incarnation)
        if kill is None:
            account.after_last_kill_tokens += attempt.num_tokens
            continue
        _charge(losses[kill.incarnation], kill, attempt, attempt.gate_rollout_id in dropped)
    mean = sum(tokens.values()) / len(tokens) if tokens else 0.0
    redo = _redo_lengths(history, sealed, tokens)
    died: set[str] = set()
    for kill in evidence:
        loss = losses[kill.incarnation]
        for in_flight in kill.in_flight:
            # A start killed before its first snapshot leaves the previous one's
            # evidence on disk: the attempts that died at an earlier kill again.
            if in_flight.attempt_hex in died:
                continue
            died.add(in_flight.attempt_hex)
            length = redo(in_flight, kill.incarnation)
            loss.in_flight_attempts += 1
            if length is None:
                loss.in_flight_unmatched += 1
                length = round(mean)
            loss.in_flight_tokens += length
    return account


def _charge(loss: KillLoss, kill: KillEvidence, attempt: AttemptLogRecord, dropped: bool) -> None:
    durable = attempt.seq <= kill.snapshot_log_seq or attempt.gate_rollout_id in (
        kill.journaled_seals
    )
    if not durable:
        loss.not_durable_tokens += attempt.num_tokens
        loss.not_durable_seals += 1
    elif dropped:
        loss.dropped_tokens += attempt.num_tokens
        loss.dropped_seals += 1
    else:
        loss.durable_lost_tokens += attempt.num_tokens
        loss.durable_lost.append(attempt.gate_rollout_id)


def _trained_rollout_ids(history: RunHistory, sealed: list[AttemptLogRecord]) -> set[str]:
    """Every attempt whose tokens trained on the effective timeline (adoptions resolved)."""
    generated_as = {a.gate_rollout_id: a.adopted_from for a in sealed if a.adopted_from}
    return {
        generated_as.get(rollout_id, rollout_id)
        for records in history.steps.values()
        for record in records
        for rollout_id in record.gate_rollout_ids
    }


def _dropped_rollout_ids(
    history: RunHistory, sealed: list[AttemptLogRecord], evidence: Sequence[KillEvidence]
) -> set[str]:
    """Sealed attempts of a dropped prompt (any start's drop).

    Of a dropped group, adopted into one, or of a group lost with the process
    whose prompt's next group was dropped (maybe before it adopted them).
    """
    groups = {drop.group_id for drop in history.drops}
    prompts = {(drop.epoch, drop.sample_id) for drop in history.drops}
    for kill in evidence:
        groups |= {
            group
            for group, (epoch, dataset_idx) in kill.group_prompts.items()
            if (epoch, str(dataset_idx)) in prompts
        }
    found = {a.gate_rollout_id for a in sealed if a.group_id in groups}
    found |= {a.adopted_from for a in sealed if a.adopted_from and a.group_id in groups}
    return found


def _displaced_rollout_ids(
    history: RunHistory, sealed: list[AttemptLogRecord], evidence: Sequence[KillEvidence]
) -> set[str]:
    """Sealed attempts of a group whose prompt trained at another target step, after a drop
    was replaced (see the module docstring).

    Only where a replaced drop happened: without one, a restore reserves every
    prompt again at the target step it had, and a seal that is not adopted is
    generated again, which is the loss :func:`durable_loss_problems` names.
    """
    if not any(drop.replaced for drop in history.drops):
        return set()
    trained_at = {
        (record.epoch, record.sample_id): record.target_step
        for records in history.steps.values()
        for record in records
    }
    groups: set[str] = set()
    for kill in evidence:
        for group, target_step in kill.group_target_steps.items():
            prompt = kill.group_prompts.get(group)
            if prompt is None:
                continue
            key = (prompt[0], str(prompt[1]))
            if key in trained_at and trained_at[key] != target_step:
                groups.add(group)
    found = {a.gate_rollout_id for a in sealed if a.group_id in groups}
    found |= {a.adopted_from for a in sealed if a.adopted_from and a.group_id in groups}
    return found


def _redo_lengths(
    history: RunHistory, sealed: list[AttemptLogRecord], tokens: dict[str, int]
) -> Callable[[InFlightAttempt, int], int | None]:
    """A function: an in-flight attempt and its kill's incarnation -> its redo's tokens."""
    prompt_groups: dict[tuple[int, str], set[str]] = defaultdict(set)
    for record in history.train:
        prompt_groups[(record.epoch, record.sample_id)].add(record.group_id)
    for drop in history.drops:
        prompt_groups[(drop.epoch, drop.sample_id)].add(drop.group_id)
    redos: dict[tuple[str, int], list[AttemptLogRecord]] = defaultdict(list)
    for attempt in sealed:
        redos[(attempt.group_id, attempt.generation_index)].append(attempt)

    def length(in_flight: InFlightAttempt, incarnation: int) -> int | None:
        groups = {in_flight.group_id}
        if in_flight.prompt is not None:
            epoch, dataset_idx = in_flight.prompt
            groups |= prompt_groups.get((epoch, str(dataset_idx)), set())
        later = [
            attempt
            for group_id in groups
            for attempt in redos.get((group_id, in_flight.generation_index), [])
            if attempt.incarnation > incarnation
        ]
        if not later:
            return None
        first = min(later, key=lambda a: (a.incarnation, a.seq))
        return tokens.get(first.adopted_from or first.gate_rollout_id)

    return length


def durable_loss_problems(config: RunConfig, account: LossAccount) -> list[str]:
    """DESIGN invariant 10, judged at each kill: no durable seal was generated again.

    Only where it must hold: a ``latest`` restore with the seal journal on, at
    ``sibling`` granularity (``prompt_group`` redoes an incomplete group whole,
    durable seals too) and without simulated failures (a failed sibling's
    sealed work may be discarded on purpose). Seals of a prompt the retry
    budget dropped are counted apart (:attr:`KillLoss.dropped_tokens`).
    """
    gate = config.gate.simulated
    applies = (
        config.rollout_checkpointing.restore_mode is RestoreMode.LATEST
        and config.rollout_checkpointing.journal.enabled
        and config.rollout.recovery_granularity is RecoveryGranularity.SIBLING
        and gate.transient_failure_rate == 0.0
        and gate.permanent_failure_rate == 0.0
    )
    if not applies:
        return []
    return [
        f"start {kill.start}: {len(kill.durable_lost)} seals durable at its kill were generated "
        f"again ({kill.durable_lost_tokens} tokens), e.g. {kill.durable_lost[:3]}"
        for kill in account.kills
        if kill.durable_lost
    ]
