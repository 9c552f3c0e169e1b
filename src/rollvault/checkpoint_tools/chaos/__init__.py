"""The chaos harness: kill a real ``rollvault run`` with SIGKILL, K times, and check it.

The harness starts ``rollvault run`` as a child process (on the packaged
config, whose simulated gate it slows down, or on ``--config FILE``, such as
the real GRPO recipe), with frequent rollout snapshots, trainer checkpoints every few
steps and a run that ends when its data runs out. Once the child has started
(its run-log directory counts the new incarnation), it waits a seeded random
delay (or, with ``kill_after_steps``, a seeded number of train steps of that
start) and kills it with SIGKILL, then starts it again; after K kills it lets
the last start finish. Then it checks the run's evidence:

- on the effective history of the logs (:mod:`rollvault.checkpoint_tools.run_history`),
  every prompt of every epoch was trained exactly once or dropped, no group
  trained twice, a step trained again has the same prompts, and each group a
  restore kept finalized trained as itself;
- with no simulated failures, every sibling of every trained group was sealed
  exactly once, net of sealed work discarded on purpose (``prompt_group``); and
  under ``prompt_group`` no restore reused a sibling;
- the final snapshot holds no orphan rows: its staged rows are exactly those
  its ledger's sealed attempts own, its train rows exactly those of its replay
  index, and it has nothing left to generate or train.

It reports the work lost (tokens generated against tokens that reached
training), and, from what each kill left on disk (read before the next
start), where every lost token went: attempts in flight at the kill, seals
not yet durable, durable seals of a prompt the retry budget dropped, and
durable seals generated again (a problem where the seal journal promises
none). ``--compare`` runs the same kill schedule under ``restore_mode=latest``
and under the ``trainer_checkpoint`` baseline, and prints both and their ratio.

Modules: :mod:`.plan` (the run config, the kill schedule, the child's command
line), :mod:`.supervisor` (starting, killing and restarting the child),
:mod:`.progress` (the train steps a start logged, for the progress-based kills),
:mod:`.checks` (the invariants on the finished run), :mod:`.kill_evidence`
(the state a kill left), :mod:`.loss` (the lost tokens by kill and kind) and :mod:`.report`
(what a harness run did, as text). ``rollvault chaos`` parses its arguments
and prints the report.
"""
