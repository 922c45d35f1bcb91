"""Where the daemon looks for its config by default; a module of its own so the command line's help can name it
without importing the config models (pydantic, PyYAML)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_CONFIG_PATH = Path("/etc/gpuwatchd/gpuwatchd.yml")
