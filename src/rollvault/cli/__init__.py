"""The ``rollvault`` command line."""
