"""The command line's start-up stays light: loading the ``gpuwatchd`` command and printing its help import none of
the heavy libraries (asyncio, aiohttp, pydantic, prometheus_client, PyYAML, psutil) or the daemon; each command
imports what it needs when it runs. Checked in fresh interpreters, as a user's shell starts them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state, write_state

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("asyncio", "aiohttp", "pydantic", "prometheus_client", "yaml", "psutil", "gpuwatchd.daemon",
         "gpuwatchd.config.loader")

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


# What `gpuwatchd run` with the default configuration must not load: each belongs to a configuration that asks for
# it (basic auth, a kubelet socket, torch probes) or to another process (pynvml and psutil: the NVML worker, which
# reads host facts of GPU processes through psutil). Deferred to where they are used (docs/performance.md,
# "Start-up"): the web config's models and basic auth (a web config file), the DCGM-compatible names
# (exporter.compat: dcgm), the notification integrations and delivery workers (a receiver; the default has none),
# and the status views (the first /api/v1/status request). docs/performance.md has what each costs. pydantic: the
# config is msgspec Structs; only `gpuwatchd sim`'s scenario files use pydantic.
NOT_IN_A_DEFAULT_DAEMON = ("psutil", "pynvml", "torch", "bcrypt", "grpc", "cryptography", "numpy", "pydantic",
                           "pydantic_core",
                           "gpuwatchd.sources.nvml.worker", "gpuwatchd.probes.worker", "gpuwatchd.config.doc",
                           "gpuwatchd.sim.runner", "gpuwatchd.sim.scenario",
                           "gpuwatchd.web.webconfig", "gpuwatchd.web.auth", "gpuwatchd.exporter.dcgm_compat",
                           "gpuwatchd.notify.delivery", "gpuwatchd.notify.integrations",
                           "gpuwatchd.notify.alertmanager", "gpuwatchd.notify.slack", "gpuwatchd.notify.discord",
                           "gpuwatchd.notify.teams", "gpuwatchd.notify.mattermost", "gpuwatchd.notify.ntfy",
                           "gpuwatchd.notify.retry",
                           "gpuwatchd.notify.redaction", "gpuwatchd.web.status", "gpuwatchd.web.detail")


def test_a_default_daemon_loads_no_optional_stack(standin_libdir: Path, tmp_path: Path) -> None:
    """``gpuwatchd run`` as a user starts it (the stand-in driver, defaults otherwise), until it has served
    /metrics with the GPUs polled; every module it imported is listed by ``-X importtime``."""
    state = tmp_path / "sim-state"
    write_state(state, make_state(2))
    cfg = tmp_path / "gpuwatchd.yml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nnvml: {{library_path: {standin_libdir}}}\n"
                   f"sysfs: {{root: {tmp_path / 'sysfs'}}}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), STATE_ENV: str(state)}
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "gpuwatchd", "run", "--config", str(cfg),
                             "--listen", f"127.0.0.1:{port}"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while "gpuwatchd_gpus 2.0" not in _metrics(port):
            assert proc.poll() is None and time.monotonic() < deadline, "the daemon did not serve both GPUs"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    loaded = {line.rsplit("|", 1)[1].strip() for line in err.splitlines() if line.startswith("import time:")}
    assert {"aiohttp.web", "gpuwatchd.daemon", "gpuwatchd.sources.nvml.supervisor"} <= loaded
    assert sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in NOT_IN_A_DEFAULT_DAEMON)) == []


def _metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return str(r.read().decode())
    except OSError:
        return ""
