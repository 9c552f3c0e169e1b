"""Training: trainers that implement :class:`rollvault.controller.loop.trainer.Trainer`."""
