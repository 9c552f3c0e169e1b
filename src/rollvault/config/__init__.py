"""The run config: schema, loading with dotpath overrides, and cross-field rules."""
