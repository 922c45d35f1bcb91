"""The `gpuwatchd` command line: one module per command group; `main` is the entry point."""

from gpuwatchd.cli.commands import main

__all__ = ["main"]
