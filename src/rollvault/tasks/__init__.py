"""Tasks: one folder per task (its dataset, its environment, its warm-up examples).

The layers above see only :mod:`rollvault.tasks.protocols`; the composition of
a run picks the task the config names (``dataset.kind``).
"""
