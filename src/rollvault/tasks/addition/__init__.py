"""The addition task: two-digit sums, verified exactly (the real training recipe's)."""
