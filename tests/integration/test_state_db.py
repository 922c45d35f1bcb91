"""A damaged state database does not stop `gpuwatchd sim` or `gpuwatchd run`: the real process starts, keeps
running, moves a broken file aside (or skips a bad row), says so once in its log, and exports it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import DaemonProcess, metrics_when, value
from test_sim_cli import interrupt, sim, start_sim

from gpuwatchd.notify.store import DB_NAME
from tests.notify.store.damage import MOVED, SKIPPED

__all__ = ["sim"]  # the fixture, used by name


def moved_aside(state: Path) -> list[Path]:
    return sorted(p for p in state.iterdir() if p.name.startswith(f"{DB_NAME}.corrupt-"))


def still_running(d: DaemonProcess) -> None:
    # Alive a while after start: no restart loop (a few evaluations and scrapes; not a timing assertion).
    for _ in range(5):
        assert d.proc.poll() is None, d.log()
        assert d.get("/healthz")[0] == 200
        time.sleep(0.2)


@pytest.mark.parametrize("name", sorted(MOVED))
def test_sim_starts_on_a_damaged_database(sim: list[DaemonProcess], tmp_path: Path, name: str) -> None:
    damage, reason = MOVED[name]
    state = tmp_path / "state"
    damage(state)
    d = start_sim(sim, tmp_path, "--scenario", "no-driver", "--state-dir", str(state))
    m = metrics_when(d, lambda m: value(m, "gpuwatchd_state_db_recovered_total", reason=reason) == 1, "recovered")
    assert value(m, "gpuwatchd_state_db_writable") == 1
    still_running(d)
    assert len(moved_aside(state)) == 1 and (state / DB_NAME).exists()
    log = d.log()
    assert log.count("is damaged") == 1 and "Traceback" not in log
    assert interrupt(d) == 0


@pytest.mark.parametrize("name", sorted(SKIPPED))
def test_sim_skips_a_bad_row_and_keeps_the_file(sim: list[DaemonProcess], tmp_path: Path, name: str) -> None:
    damage, table = SKIPPED[name]
    state = tmp_path / "state"
    damage(state)
    d = start_sim(sim, tmp_path, "--scenario", "no-driver", "--state-dir", str(state))
    m = metrics_when(d, lambda m: value(m, "gpuwatchd_state_db_rows_skipped_total", table=table) == 1, "skipped")
    assert value(m, "gpuwatchd_state_db_recovered_total", reason="corrupt") == 0
    still_running(d)
    assert moved_aside(state) == []
    assert "Traceback" not in d.log()
    assert interrupt(d) == 0


def test_run_starts_on_a_truncated_database(start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    damage, reason = MOVED["truncated"]
    damage(tmp_path / "state0")  # the fixture's state_dir for its first daemon
    d = start_daemon({})
    metrics_when(d, lambda m: value(m, "gpuwatchd_state_db_recovered_total", reason=reason) == 1, "recovered")
    still_running(d)
    assert len(moved_aside(tmp_path / "state0")) == 1
    assert d.stop() == 0
    assert "Traceback" not in d.log()
