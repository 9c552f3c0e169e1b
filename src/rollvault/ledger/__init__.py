"""The recovery ledger: records, state machines and the versioned sidecar. No I/O.

Modules, each with one job:

- ``statuses``: the four state enums, and the failure kinds;
- ``records``: groups, siblings, attempts, prompt refs (live, mutable records);
- ``datum`` / ``prompt_identity``: the runtime prompt payload and the check
  that it is the prompt a group was reserved for;
- ``reward_penalties``: reward checks, log context, finalized rewards, settings;
- ``transitions``: the state machines as data and their checked steps;
- ``receipts``: the Gate receipt's shape and validation;
- ``sealing``: fencing and recording a sibling's result;
- ``recovery``: abandoning unfinished work, minting replacements, and
  recording attempts interrupted by the process's death;
- ``attempt_ids``: minting attempt UUIDs in batches;
- ``arguments`` / ``call_checks``: checks of call arguments;
- ``ledger``: :class:`RolloutRecoveryLedger`, the mutators behind the cut;
- ``state_schema`` / ``state_checks`` / ``state_convert`` / ``state_load``:
  the persisted form, its semantic checks, conversion from live records and
  back to them; ``state_upgrade`` reads an older version;
- ``sidecar``: the full snapshot envelope and its deterministic JSON bytes;
- ``errors``: every error the ledger raises.

The spec-facing names are re-exported by :mod:`rollvault.rollout_recovery`.
"""
