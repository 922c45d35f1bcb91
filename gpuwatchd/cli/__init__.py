"""The `gpuwatchd` command line: one module per command group; `main` is the entry point."""

from gpuwatchd.cli.main import main

__all__ = ["main"]
