"""The synthetic task: seeded random token prompts scored by parity (the simulated gate's)."""
