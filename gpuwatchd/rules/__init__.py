"""Pure alert rules: history + now -> alert states (inactive -> pending -> firing -> resolved)."""
