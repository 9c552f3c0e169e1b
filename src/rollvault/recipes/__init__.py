"""Recipes: each composes one kind of run top to bottom, from its config to the pipeline."""
