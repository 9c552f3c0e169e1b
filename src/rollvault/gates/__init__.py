"""Gates: what executes an attempt (generation, environment, reward)."""
