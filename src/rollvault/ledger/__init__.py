"""The recovery ledger: records, state machines and the versioned sidecar. No I/O.

Modules, each with one job:

- ``statuses``: the four state enums;
- ``records``: groups, siblings, attempts, prompt refs (live, mutable records);
- ``transitions``: the state machines as data and their checked steps;
- ``receipts``: the Gate receipt's shape and validation;
- ``sealing``: fencing and recording a sibling's result;
- ``recovery``: abandoning unfinished work and minting replacements;
- ``ledger``: :class:`RolloutRecoveryLedger`, the mutators behind the cut;
- ``state_schema`` / ``state_checks`` / ``state_convert``: the persisted form,
  its semantic checks, and conversion to and from live records;
- ``sidecar``: the full snapshot envelope and its deterministic JSON bytes.

The spec-facing names are re-exported by :mod:`rollvault.rollout_recovery`.
"""
