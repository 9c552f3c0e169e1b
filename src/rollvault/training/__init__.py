"""Training: trainers that implement :class:`rollvault.controller.trainer.Trainer`."""
