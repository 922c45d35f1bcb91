"""The command line as scripts use it: output, and exit codes they can rely on."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd import __version__
from gpuwatchd.config.loader import config_from_dict
from gpuwatchd.daemon import Daemon
from gpuwatchd.runtime.exitcodes import (
    EXIT_CONFIG_INVALID,
    EXIT_LISTEN,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state
from gpuwatchd.sim.worker import WORKER_MODULE as SIM_WORKER_MODULE

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwatchd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
        env=ENV,
    )


async def acli(*args: str) -> tuple[int, str, str]:
    """The CLI as a child process while this test's event loop keeps serving an in-process daemon."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuwatchd", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT, env=ENV,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    except BaseException:
        # A timeout must not leave the child running and unreaped: its Popen would warn in a later test.
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_version() -> None:
    res = cli("--version")
    assert (res.returncode, res.stdout.strip()) == (EXIT_OK, f"gpuwatchd {__version__}")


def test_help_lists_commands_and_exit_codes() -> None:
    res = cli("--help")
    assert res.returncode == EXIT_OK
    for word in ("run", "check-config", "status", "sim", "exit codes:", "3  status: no daemon reachable"):
        assert word in res.stdout, word


def test_no_command_is_a_usage_error() -> None:
    res = cli()
    assert res.returncode == EXIT_USAGE
    assert "usage: gpuwatchd" in res.stderr


def test_unknown_option_is_a_usage_error() -> None:
    assert cli("run", "--frobnicate").returncode == EXIT_USAGE


def test_status_without_a_daemon_exits_3() -> None:
    port = free_port()
    res = cli("status", "--url", f"http://127.0.0.1:{port}", "--timeout", "5")
    assert res.returncode == EXIT_UNREACHABLE
    assert res.stderr.startswith(f"gpuwatchd: no gpuwatchd reachable at http://127.0.0.1:{port}: ")


def test_run_with_missing_config_exits_2(tmp_path: Path) -> None:
    res = cli("run", "--config", str(tmp_path / "nope.yml"))
    assert res.returncode == EXIT_USAGE
    assert "nope.yml: file not found" in res.stderr


def test_run_with_invalid_config_exits_1(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yml"
    cfg.write_text("nvml:\n  poll_timeout: never\n")
    res = cli("run", "--config", str(cfg))
    assert res.returncode == EXIT_CONFIG_INVALID
    assert f"{cfg}: nvml.poll_timeout: expected a duration" in res.stderr


def test_run_with_bad_listen_exits_2() -> None:
    res = cli("run", "--listen", "nowhere")
    assert res.returncode == EXIT_USAGE
    assert "--listen: expected HOST:PORT" in res.stderr


def test_run_with_port_in_use_exits_4(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nnvml: {{library_path: {tmp_path}}}\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = cli("run", "--config", str(cfg), "--listen", f"127.0.0.1:{port}")
    assert res.returncode == EXIT_LISTEN
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in res.stderr


def test_sim_unknown_scenario_exits_2() -> None:
    res = cli("sim", "--scenario", "no-such-thing")
    assert res.returncode == EXIT_USAGE
    assert "unknown scenario 'no-such-thing'" in res.stderr and "leak" in res.stderr


@pytest.fixture
async def daemon(
    tmp_path: Path, standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path]
) -> AsyncIterator[Daemon]:
    state = make_state(2)
    state["devices"][1]["processes"]["compute"] = [
        {"pid": 4242, "used_memory": 2 * 1024**3, "name": "python", "user": "alice"}
    ]
    cfg = config_from_dict(
        {
            "listen": "127.0.0.1:0",
            "state_dir": str(tmp_path / "state"),
            "nvml": {"library_path": str(standin_libdir), "poll_interval": "100ms"},
            "sysfs": {"root": str(tmp_path / "sysfs")},
        }
    )
    d = Daemon(cfg, worker_env={STATE_ENV: str(write_sim_state(state))}, worker_module=SIM_WORKER_MODULE)
    await d.start()
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while d.store.latest is None or not d.store.latest.gpus:
            assert loop.time() < end, "no snapshot from the stand-in"
            await asyncio.sleep(0.05)
        yield d
    finally:
        await d.stop()


async def test_status_table_from_a_running_daemon(daemon: Daemon) -> None:
    code, out, err = await acli("status", "--url", daemon.url)
    assert code == EXIT_OK, err
    lines = out.splitlines()
    assert lines[0].startswith(f"gpuwatchd {__version__} on ") and "NVML up, driver 535.161.08" in lines[0]
    uuids = [d["uuid"] for d in make_state(2)["devices"]]
    gpu_rows = [line for line in lines if any(u in line for u in uuids)]
    assert len(gpu_rows) == 2
    assert all("NVIDIA A10G" in row and "present" in row for row in gpu_rows)
    proc_rows = [line.split() for line in lines if "4242" in line]
    assert proc_rows == [["1", "4242", "python", "alice", "2.00", "GiB", "-"]]  # OWNER: a host process
    assert "No alerts." in lines


async def test_status_json(daemon: Daemon) -> None:
    code, out, _ = await acli("status", "--url", daemon.url, "--json")
    assert code == EXIT_OK
    doc = json.loads(out)
    assert [g["index"] for g in doc["status"]["gpus"]] == [0, 1]
    assert doc["alerts"] == []


def test_readme_and_ci_agree() -> None:
    """CI runs exactly the README's test command, and the README's exit-code table matches the code."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\n    bash .ci/run\n" in readme
    command = "python -m pytest -q -n 4 --dist loadfile"
    assert f"`{command}`" in readme
    assert f"\n{command}\n" in ci
    documented = {
        int(code): text
        for code, text in (
            row.split("|")[1:3]
            for row in readme.splitlines()
            if row.startswith("| ") and row.split("|")[1].strip().isdigit()
        )
    }
    from gpuwatchd.runtime import exitcodes as cli_module

    codes = {getattr(cli_module, n) for n in dir(cli_module) if n.startswith("EXIT_") and n != "EXIT_CODES_HELP"}
    assert set(documented) == codes


@pytest.mark.parametrize(
    ("listen", "url"),
    [
        ("0.0.0.0:9999", "http://127.0.0.1:9999"),
        ("[::]:9945", "http://[::1]:9945"),
        ("10.1.2.3:80", "http://10.1.2.3:80"),
    ],
)
def test_status_url_follows_the_config(tmp_path: Path, listen: str, url: str) -> None:
    from gpuwatchd.runtime.daemon_client import default_status_url

    cfg = tmp_path / "c.yml"
    cfg.write_text(f'listen: "{listen}"\n')
    assert default_status_url(cfg) == url
