"""Health probes run in a killable subprocess (the worker is the only torch importer)."""
