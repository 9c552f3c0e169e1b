"""The run config's schema: its sections as strict, frozen msgspec Structs, and its enums.

Every knob has a default, so an empty file (or none) is a complete config.
"""

from __future__ import annotations

import enum
from typing import Annotated, Final

import msgspec

from rollvault.ledger.statuses import RecoveryGranularity

__all__ = [
    "DEFAULT_ALPHABET",
    "CheckpointingConfig",
    "DataPlaneConfig",
    "DataPlaneKind",
    "DatasetConfig",
    "FILE_DATASET_KINDS",
    "GateConfig",
    "GateKind",
    "GrpoConfig",
    "LocalModelGateConfig",
    "LoggingConfig",
    "ModelConfig",
    "ModelDType",
    "OnDroppedPrompt",
    "RecoveryGranularity",
    "RestoreMode",
    "RewardConfig",
    "RolloutCheckpointingConfig",
    "RayConfig",
    "RayGateConfig",
    "RolloutConfig",
    "RunConfig",
    "SamplerConfig",
    "SamplerKind",
    "SamplingConfig",
    "SimulatedGateConfig",
    "TrainerConfig",
    "TrainerKind",
    "TransferQueueConfig",
    "TrainerPlacement",
    "VllmGateConfig",
    "WarmupConfig",
]


PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0.0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0.0)]
Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
UnitFraction = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]

DEFAULT_ALPHABET = "0123456789+-*="
"""The default model's characters: digits and the operators of small arithmetic prompts.
Defined here (the training layer's tokenizer imports it) so ``model.default_alphabet``
can default to it."""


class SamplerKind(enum.StrEnum):
    """Which staleness policy decides what the trainer may take."""

    IN_ORDER = "in_order"
    WINDOWED = "windowed"


class OnDroppedPrompt(enum.StrEnum):
    """What happens to a target step when one of its groups is permanently lost."""

    REPLACE = "replace"
    SHRINK = "shrink"


class GateKind(enum.StrEnum):
    """What executes an attempt."""

    SIMULATED = "simulated"
    LOCAL_MODEL = "local_model"
    RAY = "ray"
    """A pool of Ray actors, each hosting the local model's generation engine."""
    VLLM = "vllm"
    """OpenAI-compatible vLLM servers, started by the run or run by someone else."""


class DataPlaneKind(enum.StrEnum):
    """Which store holds the token rows."""

    EMBEDDED = "embedded"
    TRANSFER_QUEUE = "transfer_queue"


class TrainerKind(enum.StrEnum):
    """What consumes each step's batch."""

    RECORDING = "recording"
    """Checks and records batches, trains nothing (tests, the simulated run)."""
    GRPO = "grpo"
    """Trains the model of ``model.path`` with the clipped GRPO surrogate."""


class TrainerPlacement(enum.StrEnum):
    """Where the GRPO trainer runs."""

    LOCAL = "local"
    """In the controller's process (a thread beside its event loop)."""
    PROCESS = "process"
    """In a process of its own on this machine, started and reaped by the controller; the
    controller keeps the ledger and the snapshots and sends it samples and checkpoint paths."""
    RAY = "ray"
    """In a Ray actor (on any node of the cluster); the controller keeps the ledger and
    the snapshots and sends it batches and checkpoint paths."""


class ModelDType(enum.StrEnum):
    """The dtype the policy's weights are loaded and computed in (generation and training)."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


class PrefixResume(enum.StrEnum):
    """What a restore does with the journaled prefix of a turn that was generating at a kill."""

    OFF = "off"
    """Nothing is journaled mid-turn: an interrupted turn is generated again from its start."""
    KEEP = "keep"
    """The turn continues after its journaled prefix, whose tokens are trained as they are."""
    MASK_STALE = "mask_stale"
    """As ``keep``, but prefix tokens older than the sampler's staleness limit allows stay in
    the row as context with loss mask 0."""


class JournalWriterPlacement(enum.StrEnum):
    """Where the seal journal's writer frames, writes and flushes its records."""

    THREAD = "thread"
    """A thread of the controller's process, under the event loop's GIL."""
    PROCESS = "process"
    """A child process of the controller's, fed the records' bytes over a pipe."""


class RestoreMode(enum.StrEnum):
    """What a start does with an existing checkpoint directory."""

    LATEST = "latest"
    TRAINER_CHECKPOINT = "trainer_checkpoint"
    NONE = "none"


class _Section(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Base of every config section: strict, immutable, keyword-only."""


class GrpoConfig(_Section, frozen=True):
    """Shape of a GRPO step and when the run stops."""

    # Prompt groups the trainer consumes per optimizer step.
    num_prompts_per_step: PositiveInt = 8
    # Generations (siblings) per prompt group.
    num_generations_per_prompt: PositiveInt = 4
    # Stop after this many optimizer steps ...
    max_num_steps: PositiveInt = 200
    # ... or after this many passes over the dataset, whichever comes first.
    max_num_epochs: PositiveInt = 10


class SamplerConfig(_Section, frozen=True):
    """Dataloader order and the staleness policy."""

    # in_order stamps each admitted group with a target step; windowed does not.
    kind: SamplerKind = SamplerKind.IN_ORDER
    # in_order admits a group stamped S only while S <= trainer_version + this.
    max_lookahead_versions: NonNegativeInt = 1
    # windowed trains a group only if trainer_version - start_weight_version <= this.
    max_staleness_versions: NonNegativeInt = 1
    # Permute the dataset each epoch, seeded by (seed, epoch).
    shuffle: bool = True


class RolloutConfig(_Section, frozen=True):
    """Capacity, retries and the policy for permanently lost groups."""

    # In-flight semaphore: prompt groups being generated at once.
    max_inflight_prompts: PositiveInt = 16
    # Replay-capacity semaphore, in groups; must hold at least one full step.
    max_buffered_rollouts: PositiveInt = 32
    # sibling: reuse sealed siblings after a failure; prompt_group: redo the whole group,
    # and generate all its siblings with one weight version.
    recovery_granularity: RecoveryGranularity = RecoveryGranularity.SIBLING
    # Infrastructure (transient) failures tolerated per sibling before the group is lost.
    max_sibling_retries: NonNegativeInt = 3
    # Interruptions tolerated per sibling (its attempt was in flight when the process
    # died) before the group is lost as a poison prompt. Larger than the infra budget:
    # an external kill is indistinguishable from a poison prompt, and a run killed often
    # must not drop the innocent prompt a restart always dispatches first; a real poison
    # prompt still stops after this many + 1 restarts. Part of the run's fingerprint
    # (it decides which prompts train).
    max_interrupted_retries: NonNegativeInt = 8
    # Data (permanent) failures tolerated per group before it is lost.
    max_group_retries: NonNegativeInt = 2
    # replace: a lost group is replaced by a spare prompt with the same target step;
    # shrink: its step trains on fewer groups (down to the floor below).
    on_dropped_prompt: OnDroppedPrompt = OnDroppedPrompt.REPLACE
    # Floor of a shrunk step, as a fraction of num_prompts_per_step (rounded up).
    min_step_batch_fraction: UnitFraction = 0.5
    # Size of the replacement reserve pulled ahead from the dataloader, within the
    # current epoch only; an epoch's unused spares train before the next epoch starts.
    num_spare_prompts: NonNegativeInt = 2
    # Multi-turn episodes interrupted by a kill continue at their last committed turn
    # (environment state from the snapshot); false restarts them from their first turn
    # (what other frameworks do; the benchmark's baseline).
    turn_level_restore: bool = True
    # Token-prefix resume (local_model and ray gates): a turn is generated in chunks of
    # prefix_resume_tokens new tokens, each chunk's tokens journaled as the turn's partial
    # output, and a restore continues the turn after its journaled prefix. off: one call
    # per turn, nothing journaled mid-turn; keep: the prefix is trained as generated;
    # mask_stale: prefix tokens from a weight version older than the sampler's staleness
    # limit allows (sampler.max_lookahead_versions for in_order, max_staleness_versions for
    # windowed) get loss mask 0. Both fields are part of the run's identity: the chunks'
    # seeds (per attempt, turn and token offset) decide the sampled tokens.
    prefix_resume: PrefixResume = PrefixResume.OFF
    # New tokens per chunk (between partial records) when prefix_resume is not off.
    prefix_resume_tokens: PositiveInt = 16


class RewardConfig(_Section, frozen=True):
    """Reward checks, penalties and advantage normalisation applied by the finalizer."""

    # Subtracted from the reward of a response that reaches max_response_tokens.
    overlong_penalty: NonNegativeFloat = 0.0
    # Mask (exclude from the loss) a response that reaches max_response_tokens.
    mask_overlong: bool = True
    # Responses of this many tokens or more count as overlong.
    max_response_tokens: PositiveInt = 256
    # Subtracted from the reward of a response whose format check failed.
    format_penalty: NonNegativeFloat = 0.0
    # Mask a response whose generation logprobs are not all finite.
    mask_nonfinite_logprobs: bool = True
    # Divide group-relative advantages by the group's reward std (plus epsilon).
    normalize_advantages_by_std: bool = True
    # Keeps the std division finite when every sibling got the same reward.
    advantage_epsilon: PositiveFloat = 1e-6
    # The reward function a model gate scores responses with, instead of the task's
    # own environment: a built-in (exact_match, numeric_match, regex_format),
    # "my_pkg.rewards:score" (an importable module) or "path/to/rewards.py:score"
    # (a file, relative to the current directory). Called as score(response_text,
    # sample); returns a float, or a mapping with reward and optionally correct
    # (what accuracy counts; a response without it is left out of the accuracy)
    # and named checks. null: the task's own scoring. Its source file's digest is
    # part of the run's fingerprint. See rollvault.rewards.
    function: NonEmptyStr | None = None
    # The regex_format built-in's pattern, matched against the whole response
    # (re.fullmatch, re.DOTALL); only that built-in uses it.
    format_regex: NonEmptyStr | None = None
    # Seconds one call of a user's reward function may take; a call still running
    # then fails its attempt as a data failure (named in attempts.jsonl), and the
    # retry budgets decide the rest. A sync function runs in a thread, which keeps
    # running until the function returns: only its attempt is released. null: no limit.
    timeout_s: PositiveFloat | None = 300.0


class SimulatedGateConfig(_Section, frozen=True):
    """The deterministic simulated gate used by tests and benchmarks."""

    # Token ids are drawn from [0, vocab_size); the synthetic dataset uses it too.
    vocab_size: Annotated[int, msgspec.Meta(ge=2)] = 512
    # Response lengths follow a lognormal around the median, clipped to [min, max].
    min_response_tokens: PositiveInt = 4
    median_response_tokens: PositiveInt = 32
    # Sigma of the lognormal: larger means a longer tail, like reasoning rollouts.
    tail_sigma: NonNegativeFloat = 1.0
    max_response_tokens: PositiveInt = 512
    # Simulated generation time per response token, in seconds.
    latency_per_token_s: NonNegativeFloat = 0.0
    # Probability that an attempt fails and may be retried (infrastructure failure).
    transient_failure_rate: Probability = 0.0
    # Probability that an attempt fails in a way retrying the same data will not fix.
    permanent_failure_rate: Probability = 0.0
    # Tests: SIGKILL the whole process when an attempt of this dataset index starts
    # (a poison prompt); null: never.
    crash_on_prompt_idx: NonNegativeInt | None = None


class SamplingConfig(_Section, frozen=True):
    """How a model gate samples (local_model and vllm alike): its first four settings."""

    # Logits are divided by this before sampling; the GRPO trainer divides by it
    # too when it recomputes logprobs.
    temperature: PositiveFloat = 1.0
    # Nucleus sampling: draw from the smallest set of most likely tokens whose
    # probability reaches top_p, renormalized (after top_k); 1.0 turns it off.
    # The logprob of a token is that of the renormalized distribution (vllm: the
    # server's processed_logprobs), and the trainer recomputes it with the same filter.
    top_p: UnitFraction = 1.0
    # Draw only from the top_k most likely tokens (ties at the k-th are kept),
    # renormalized; 0 turns it off.
    top_k: NonNegativeInt = 0
    # A response that has not ended with eos (vllm: a stop token) after this many
    # tokens is cut (overlong).
    max_new_tokens: PositiveInt = 8


class LocalModelGateConfig(SamplingConfig, frozen=True):
    """The local model gate: generation in a worker process, temperature/top-k/top-p sampling."""

    # At most this many waiting requests are generated together in one batch.
    max_batch_size: PositiveInt = 64


class RayGateConfig(_Section, frozen=True):
    """The Ray generation actor pool (gate.kind: ray); sampling follows gate.local_model."""

    # Generation actors, each holding a copy of the policy.
    num_actors: PositiveInt = 2
    # Ray resources each actor asks for (it is placed where they are free).
    num_cpus_per_actor: NonNegativeFloat = 1.0
    num_gpus_per_actor: NonNegativeFloat = 0.0
    # Times a dead actor is restarted before the pool gives it up.
    max_actor_restarts: NonNegativeInt = 8
    # Seconds one actor call may take ((re)start and model load, a weight load, one
    # batch) before the actor counts as lost and is restarted.
    actor_call_timeout_s: PositiveFloat = 120.0


class VllmGateConfig(SamplingConfig, frozen=True):
    """The vLLM gate: OpenAI-compatible vLLM servers, started by the run or run by someone else.

    Sampling as in local_model (:class:`SamplingConfig`): the server's logprobs
    (processed_logprobs) and the trainer's recomputation use the same temperature,
    top_p and top_k.
    """

    # true: start num_servers servers as child processes (127.0.0.1 only) and restart
    # any that dies; false: use the servers of urls, run by someone else.
    launch: bool = True
    num_servers: PositiveInt = 1
    # External servers (launch: false), e.g. ["http://10.0.0.5:8000"]. They must run with
    # VLLM_SERVER_DEV_MODE=1 and --logprobs-mode processed_logprobs, serve model.path
    # (--model at its absolute path), read weights_dir at the same path, and be
    # unreachable from untrusted networks.
    urls: list[NonEmptyStr] = msgspec.field(default_factory=list)
    # The Python that starts managed servers; null: $ROLLVAULT_VLLM_PYTHON, else
    # .venv-vllm/bin/python (created by make vllm-venv).
    python: NonEmptyStr | None = None
    # Port of the first managed server (the next ones count up); 0: any free port.
    base_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0
    # Managed servers' --max-model-len, --gpu-memory-utilization, VLLM_CPU_KVCACHE_SPACE (GB).
    max_model_len: PositiveInt = 128
    gpu_memory_utilization: UnitFraction = 0.2
    kv_cache_space_gb: PositiveInt = 1
    # Further arguments for managed servers' api_server command line.
    extra_args: list[str] = msgspec.field(default_factory=list)
    # Where each weight version is written (model.safetensors) for servers to reload;
    # also holds the managed servers' logs.
    weights_dir: NonEmptyStr = "runs/default/vllm"
    # Weight versions kept in weights_dir (the newest ones).
    keep_weight_versions: PositiveInt = 2
    # Seconds one HTTP call may take before it fails as an infra failure.
    request_timeout_s: PositiveFloat = 60.0
    # Seconds a server may take to answer /health after a (re)start.
    startup_timeout_s: PositiveFloat = 300.0
    # Restarts (or reconnection probes) of one server in a row before it stays dead.
    max_restarts: NonNegativeInt = 3
    # Environment variable holding the servers' API key (sent as a Bearer token); null: none.
    api_key_env: NonEmptyStr | None = None


class GateConfig(_Section, frozen=True):
    """Which gate runs attempts, and its settings."""

    kind: GateKind = GateKind.SIMULATED
    simulated: SimulatedGateConfig = msgspec.field(default_factory=SimulatedGateConfig)
    local_model: LocalModelGateConfig = msgspec.field(default_factory=LocalModelGateConfig)
    ray: RayGateConfig = msgspec.field(default_factory=RayGateConfig)
    vllm: VllmGateConfig = msgspec.field(default_factory=VllmGateConfig)


class ModelConfig(_Section, frozen=True):
    """The policy model: a local Hugging Face causal LM directory (never downloaded)."""

    # Directory holding config.json, model.safetensors and the tokenizer files.
    path: NonEmptyStr = "runs/default/model"
    # When the directory does not exist, build the default tiny Qwen2-style model
    # with its character tokenizer there (seeded by ``seed``).
    build_default: bool = True
    # The ASCII characters the default model's tokenizer knows, one token each; any
    # other character of a prompt is dropped, so cover the task's text. Whitespace is
    # a character like any other (e.g. a space for word problems). Used only when the
    # default model is built: an existing directory is loaded as it is.
    default_alphabet: NonEmptyStr = DEFAULT_ALPHABET
    # Render each prompt with the tokenizer's chat template (add_generation_prompt):
    # a datum's ``messages`` (a list of {role, content}) or its prompt_text as one
    # user message. The tokenizer must have a chat template. Generation then also
    # stops on the template's end-of-turn token.
    chat_template: bool = False
    # With chat_template: a system message put first, unless the datum has its own.
    system_prompt: NonEmptyStr | None = None
    # float32 or bfloat16: the dtype of the weights in the generation worker and the
    # trainer alike (logprobs are computed from float32 logits either way). With
    # bfloat16 the optimizer updates bfloat16 weights (no float32 master copy).
    dtype: ModelDType = ModelDType.FLOAT32


class WarmupConfig(_Section, frozen=True):
    """Supervised warm-up on the task's answers before RL (part of the default recipe)."""

    # Optimizer steps of warm-up; 0 turns it off.
    steps: NonNegativeInt = 0
    # Prompt/answer pairs per warm-up step.
    batch_size: PositiveInt = 64
    learning_rate: PositiveFloat = 3e-3


class TrainerConfig(_Section, frozen=True):
    """Which trainer consumes the batches, and the GRPO optimisation settings."""

    kind: TrainerKind = TrainerKind.RECORDING
    # AdamW settings.
    learning_rate: PositiveFloat = 1e-4
    weight_decay: NonNegativeFloat = 0.0
    # The importance ratio against the generation logprobs is clipped to [1 - eps, 1 + eps].
    clip_epsilon: PositiveFloat = 0.2
    # Weight of the KL penalty to the frozen initial policy; 0 (the default) turns it off.
    kl_coef: NonNegativeFloat = 0.0
    # Gradients are clipped to this global norm.
    grad_clip: PositiveFloat = 1.0
    # Sequences per forward/backward pass; a step accumulates the gradients of its
    # micro-batches (weighted so the loss is the whole batch's) and takes one optimizer
    # step. null: the whole step's batch in one pass. Lower it when a step runs out of memory.
    micro_batch_size: PositiveInt | None = None
    warmup: WarmupConfig = msgspec.field(default_factory=WarmupConfig)
    # local: the trainer runs in the controller's process (a thread beside the event loop);
    # process: in a process of its own on this machine (grpo only), so that it does not share
    # the controller's GIL; ray: in a Ray actor (grpo only).
    placement: TrainerPlacement = TrainerPlacement.LOCAL
    # Ray resources of the trainer actor (placement: ray).
    ray_num_cpus: NonNegativeFloat = 1.0
    ray_num_gpus: NonNegativeFloat = 0.0


class DatasetConfig(_Section, frozen=True):
    """The prompt dataset."""

    # The task: the name of a folder under rollvault/tasks/ (synthetic, addition, ...),
    # checked against those folders when the run is composed.
    kind: NonEmptyStr = "synthetic"
    # Prompts per epoch of the built-in tasks. File datasets (jsonl, parquet) ignore
    # it: their epoch is every row of the file (a default of 256 must not cut a file
    # short without a word; to train on part of a file, give a shorter file).
    num_prompts: PositiveInt = 256
    # Tokens per synthetic prompt.
    prompt_tokens: PositiveInt = 16
    # kind jsonl or parquet: the file of rows (relative to the directory rollvault runs
    # in); required by those kinds, refused by the others. Not part of the run's
    # fingerprint: a resume compares the file's rows one by one with those the run
    # started with, so a moved file is the same dataset and a changed row is refused,
    # naming it.
    path: NonEmptyStr | None = None
    # File datasets: the field of each row holding the prompt text (a non-empty string).
    # Unused when messages_key is set.
    prompt_key: NonEmptyStr = "prompt"
    # File datasets: the field holding the reference answer, handed to the reward as
    # extra_env_info.answer. A row without it (or null there) has no answer; null here:
    # no row has one. Numbers become strings (7 -> "7", 2.5 -> "2.5").
    answer_key: NonEmptyStr | None = "answer"
    # File datasets: the field holding a chat, a list of {role, content} string
    # mappings; set it for chat-format rows (then prompt_key is not used).
    messages_key: NonEmptyStr | None = None


FILE_DATASET_KINDS: Final = frozenset({"jsonl", "parquet"})
"""The ``dataset.kind`` values that read their rows from ``dataset.path``."""


class LoggingConfig(_Section, frozen=True):
    """Where logs go and whether to show live progress."""

    # Holds train_log.jsonl and attempts.jsonl.
    log_dir: NonEmptyStr = "runs/default/logs"
    # Live progress display on the terminal.
    progress: bool = True
    # Also write metrics as TensorBoard events, when the tensorboard package is installed.
    tensorboard: bool = False


class CheckpointingConfig(_Section, frozen=True):
    """Durable trainer checkpoints."""

    # Root of trainer checkpoints, rollout snapshots and the bootstrap anchor.
    checkpoint_dir: NonEmptyStr = "runs/default/checkpoints"
    # A trainer checkpoint every this many optimizer steps.
    save_period: PositiveInt = 50
    # Trainer checkpoints kept; older ones are pruned once a new one is written.
    keep_latest_k: PositiveInt = 2


class SealJournalConfig(_Section, frozen=True):
    """The seal journal: seals, finalizations and steps since the newest snapshot."""

    # Journal each seal (with its staged rows), finalization and train step, so a
    # restore replays what was sealed after the newest snapshot instead of
    # generating it again. Needs rollout_checkpointing.enabled.
    enabled: bool = True
    # Group commit: groups are at least this many milliseconds apart, so a record
    # waits no longer than this (none after a quiet spell); a seal is kept once its
    # group is flushed.
    commit_interval_ms: NonNegativeFloat = 20.0
    # A group is flushed early once it holds this many records.
    max_batch_records: PositiveInt = 512
    # Finalize and step records open no group of their own: they ride on the next
    # seal's, or are flushed alone once the oldest has waited this long. Restore only
    # counts them, so this trades their fsyncs against how long they stay undurable.
    lazy_interval_ms: NonNegativeFloat = 1000.0
    # While the journal takes records it keeps every seal, so what a periodic snapshot
    # bounds is no longer what a kill loses but what a restore replays (and the
    # journal's disk): one falls due as soon as this many MiB were journaled since the
    # newest committed state, before interval_s if need be.
    snapshot_after_mib: PositiveFloat = 64.0
    # Where the records are framed, written and flushed: a thread of the controller,
    # or a child process of its own (the event loop's interpreter then only hands
    # each batch's bytes to a pipe). The same records, the same durability.
    writer: JournalWriterPlacement = JournalWriterPlacement.PROCESS


class RolloutCheckpointingConfig(_Section, frozen=True):
    """Rollout snapshots between trainer checkpoints, and restore."""

    # Write periodic rollout snapshots at all.
    enabled: bool = True
    # Seconds between snapshots (skipped when nothing changed), counted from the newest
    # committed state: a trainer checkpoint's rollout state defers the next one too.
    # null: 60 s while the seal journal keeps every seal (a snapshot then only bounds
    # what a restore replays), 5 s without it (everything sealed since the newest
    # snapshot is generated again after a kill). See snapshot_schedule.interval_for.
    interval_s: PositiveFloat | None = None
    # Committed snapshots kept per anchor; older ones are pruned.
    keep_latest_k: PositiveInt = 2
    # Failed snapshots in a row (disk full, I/O error) after which the run stops.
    # Each failure keeps the previous snapshot and is retried after a wait that
    # doubles from the interval (up to 8x); a success resets the count.
    max_consecutive_failures: PositiveInt = 5
    # latest: newest compatible snapshot; trainer_checkpoint: regenerate everything
    # after the last trainer checkpoint (the baseline); none: start fresh.
    restore_mode: RestoreMode = RestoreMode.LATEST
    # With restore_mode=none, start fresh even if the directory holds a run.
    force_fresh: bool = False
    # After SIGTERM or SIGINT, seconds to stop and write the final rollout snapshot;
    # past this the run exits anyway and a restart uses the last committed snapshot.
    # Keep it below the scheduler's grace before SIGKILL (30 s by default for
    # Kubernetes' terminationGracePeriodSeconds and SLURM's KillWait).
    shutdown_grace_s: PositiveFloat = 20.0
    # The seal journal (see SealJournalConfig).
    journal: SealJournalConfig = msgspec.field(default_factory=SealJournalConfig)


class TransferQueueConfig(_Section, frozen=True):
    """TransferQueue on Ray, used with ``dataplane.kind: transfer_queue`` (the ``[tq]`` extra)."""

    # Storage actors holding the rows. TransferQueue's controller and each unit
    # take one Ray CPU: on a small machine keep this at 1 (its default of 2 hangs
    # ``transfer_queue.init`` on a 2-CPU Ray).
    num_storage_units: PositiveInt = 1
    # Seconds ``transfer_queue.init`` may take before the start fails with a
    # message naming Ray's CPUs (it hangs, rather than fails, when they are too few).
    init_timeout_s: PositiveFloat = 180.0
    # Logical CPUs of a Ray the data plane starts itself, when a pipeline runs
    # outside `rollvault run` (tests, benchmarks; `rollvault run` starts the run's
    # Ray per ray.*, with room for TransferQueue); null: TQ's actors' CPUs plus 2.
    ray_num_cpus: PositiveInt | None = None


class DataPlaneConfig(_Section, frozen=True):
    """The store of token rows: where the gate's and finalizer's rows live."""

    # embedded: in the controller's process. transfer_queue: TransferQueue's
    # storage actors on Ray; snapshots are the same files either way, so a run
    # may resume on the other store.
    kind: DataPlaneKind = DataPlaneKind.EMBEDDED
    transfer_queue: TransferQueueConfig = msgspec.field(default_factory=TransferQueueConfig)


class RayConfig(_Section, frozen=True):
    """Where Ray runs, for gate.kind: ray, trainer.placement: ray and the TransferQueue store."""

    # local: start a private Ray for this run and shut it down at its end; auto: join
    # the cluster of `ray start --head` on this machine; ray://host:port: a remote one.
    address: NonEmptyStr = "local"
    # address local: logical CPUs the private Ray offers (null: the machine's count,
    # plus one per TransferQueue actor with dataplane.kind: transfer_queue).
    num_cpus: PositiveInt | None = None
    # address local: the private Ray's temp dir is <temp_root>/rvray_<run hash>; keep it
    # short (Ray's socket paths must stay under 107 characters).
    temp_root: NonEmptyStr = "/tmp"


class RunConfig(_Section, frozen=True):
    """The whole run config."""

    # Seeds the dataset, the epoch permutations and the simulated gate.
    seed: NonNegativeInt = 0
    grpo: GrpoConfig = msgspec.field(default_factory=GrpoConfig)
    sampler: SamplerConfig = msgspec.field(default_factory=SamplerConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    reward: RewardConfig = msgspec.field(default_factory=RewardConfig)
    gate: GateConfig = msgspec.field(default_factory=GateConfig)
    dataset: DatasetConfig = msgspec.field(default_factory=DatasetConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    trainer: TrainerConfig = msgspec.field(default_factory=TrainerConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
    checkpointing: CheckpointingConfig = msgspec.field(default_factory=CheckpointingConfig)
    rollout_checkpointing: RolloutCheckpointingConfig = msgspec.field(
        default_factory=RolloutCheckpointingConfig
    )
    dataplane: DataPlaneConfig = msgspec.field(default_factory=DataPlaneConfig)
    ray: RayConfig = msgspec.field(default_factory=RayConfig)
