"""The command line's start-up stays light: loading the ``gpuwatchd`` command and printing its help import none of
the heavy libraries (aiohttp, pydantic, prometheus_client, PyYAML, psutil) or the daemon; each command imports what
it needs when it runs. Checked in fresh interpreters, as a user's shell starts them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("aiohttp", "pydantic", "prometheus_client", "yaml", "psutil", "gpuwatchd.daemon", "gpuwatchd.config.loader")

_REPORT = """
import json, sys
{body}
print(json.dumps(sorted(m for m in sys.modules if m in {heavy!r} or m.split('.')[0] in {heavy!r})), file=sys.stderr)
"""


def _loaded(body: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _REPORT.format(body=body, heavy=HEAVY)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    last = proc.stderr.strip().splitlines()[-1]
    loaded: list[str] = json.loads(last)
    return loaded


def test_importing_the_command_line_loads_no_heavy_library() -> None:
    assert _loaded("import gpuwatchd.cli") == []


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["sim", "--help"], ["status", "--help"],
                                  ["probe", "--help"], ["doctor", "--help"], ["check-config", "--help"], ["--version"],
                                  ["no-such-command"]])
def test_help_and_usage_errors_load_no_heavy_library(argv: list[str]) -> None:
    body = f"""
from gpuwatchd.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
"""
    assert _loaded(body) == []


def test_the_help_of_every_command_still_names_its_defaults() -> None:
    """The defaults moved to light modules (config.paths, doctor.defaults) are the ones the commands use."""
    from gpuwatchd.config import loader
    from gpuwatchd.doctor import context

    proc = subprocess.run([sys.executable, "-m", "gpuwatchd", "doctor", "--help"], env={**os.environ,
                          "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120, check=True)
    help_text = " ".join(proc.stdout.split())
    assert str(loader.DEFAULT_CONFIG_PATH) in help_text
    assert f"default: {context.SERVICE_USER}" in help_text
    assert f"default {context.DEFAULT_DEADLINE:g}" in help_text
