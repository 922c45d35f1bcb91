"""SIGHUP with a hostile config file, to a real `gpuwatchd run`: refused, said once, reported by the metric, and
the daemon keeps serving with its running config (no hang, no memory blow-up, no stray task exception)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import DaemonProcess, metrics_when, value, wait_until

from gpuwatchd.sim.state import make_state

FAST_NVML = {"poll_interval": "100ms", "restart_backoff_initial": "100ms", "restart_backoff_max": "300ms"}
FAILED = "config reload failed; keeping the running config"


def _laughs() -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    return "\n".join(lines) + "\n"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.timeout(900)  # nine reloads, each waited for with a generous deadline on a loaded machine
def test_hostile_reloads_are_refused_and_reported(
    start_daemon: Callable[..., DaemonProcess],
    standin_libdir: Path,
    write_sim_state: Callable[[dict[str, Any]], Path],
) -> None:
    state = make_state(1)
    d = start_daemon({"nvml": {"library_path": str(standin_libdir), **FAST_NVML}}, write_sim_state(state))
    uuid = state["devices"][0]["uuid"]
    metrics_when(d, lambda m: value(m, "gpuwatchd_gpu_memory_used_bytes", uuid=uuid) is not None, "GPU values")
    assert value(d.metrics(), "gpuwatchd_config_last_reload_successful") == 1
    good = d.config_path.read_text()
    rss_before = _rss_kib(d.proc.pid)

    def as_text(text: str | bytes) -> Callable[[Path], None]:
        return lambda p: p.write_bytes(text if isinstance(text, bytes) else text.encode())

    def as_fifo(p: Path) -> None:
        p.unlink()
        os.mkfifo(p)

    def as_link(target: str) -> Callable[[Path], None]:
        def make(p: Path) -> None:
            p.unlink()
            p.symlink_to(target)

        return make

    hostile: list[tuple[str, Callable[[Path], None]]] = [
        ("billion laughs", as_text(_laughs())),
        ("10 MB", as_text(b"# " + b"x" * (10 << 20))),
        ("deep nesting", as_text("a: " + "[" * 100_000)),
        ("non-UTF-8", as_text(b"host: \xff\xfe\n")),
        ("huge integer", as_text("processes: {top_n: " + "9" * 5000 + "}\n")),
        ("history.step 0", as_text(good + "history: {step: 0}\n")),
        ("FIFO", as_fifo),
        ("/dev/zero", as_link("/dev/zero")),
        ("/dev/urandom", as_link("/dev/urandom")),
    ]
    for n, (what, make) in enumerate(hostile, start=1):
        if d.config_path.is_symlink() or d.config_path.is_fifo():
            d.config_path.unlink()
            d.config_path.write_text(good)
        make(d.config_path)
        d.proc.send_signal(signal.SIGHUP)
        wait_until(lambda n=n: d.log().count(FAILED) >= n, f"the reload of {what} to fail")  # type: ignore[misc]
        m = d.metrics()  # still serving, from the running config
        assert value(m, "gpuwatchd_config_last_reload_successful") == 0, what
        assert value(m, "gpuwatchd_nvml_up") == 1, what

    log = d.log()
    assert log.count(FAILED) == len(hostile), log
    assert "Traceback" not in log and "never retrieved" not in log, log
    failed_lines = [line for line in log.splitlines() if FAILED in line]
    assert any("not a regular file (a FIFO)" in line for line in failed_lines), failed_lines
    assert any("aliases expanded" in line for line in failed_lines), failed_lines
    assert any("history.step: must be greater than 0" in line for line in failed_lines), failed_lines
    # Bounded: the file is never read or expanded whole (the reported blow-up was ~1.9 GB).
    assert _rss_kib(d.proc.pid) < rss_before + 100 * 1024

    d.config_path.unlink()
    d.config_path.write_text(good)
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: value(d.metrics(), "gpuwatchd_config_last_reload_successful") == 1, "the good reload")
    assert d.stop() == 0
