"""The run config.

Modules, from the bottom up: ``errors`` (:class:`ConfigError`), ``schema`` (the
sections as msgspec Structs and their enums), ``yaml_loader`` (safe YAML parsing),
``dotpaths`` (walking the schema by dotpath, unknown-key suggestions),
``overrides`` (``a.b.c=value``), ``rules`` (cross-field checks) and ``loading``
(file plus overrides to a validated :class:`RunConfig`).
"""
