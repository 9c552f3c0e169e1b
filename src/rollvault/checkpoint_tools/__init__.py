"""Checkpoint tooling above the controller: inventory, run history, verification, chaos.

These read checkpoint directories and run logs (and, for chaos, supervise
real runs); the command line only parses arguments and prints their results.
"""
