"""The reporter thread: lines on the socket, nothing raised into the script, nothing done without a daemon."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.training import input_wait, stats, wire
from gpuwatchd.training.reporter import Reporter, default_socket
from tests.training.conftest import Listener, recorded

WAIT_S = 60.0


def wait_for(cond: Callable[[], Any], what: str) -> Any:
    end = time.monotonic() + WAIT_S
    while not (r := cond()):
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)
    return r


@pytest.fixture
def replayed(monkeypatch: pytest.MonkeyPatch) -> list[stats.RawDevice]:
    """The seam: read_devices returns recorded dicts as if torch had read them."""
    devices = [stats.RawDevice(0, "GPU-a", recorded("minkowski-359-a.json"), 3 << 30, 16 << 30),
               stats.RawDevice(1, "GPU-b", recorded("torchrec-3580.json"))]
    monkeypatch.setitem(__import__("sys").modules, "torch", object())
    monkeypatch.setattr(stats, "read_devices", lambda torch: devices)
    return devices


def test_one_line_per_interval_in_schema_1(listener: Listener, replayed: list[stats.RawDevice]) -> None:
    r = Reporter(listener.path, interval=0.05)
    r.start()
    msgs = wait_for(lambda: len(listener.messages()) >= 2 and listener.messages(), "two reports")
    r.stop()
    m = msgs[0]
    assert m["v"] == wire.SCHEMA_VERSION and m["pid"] == os.getpid() and abs(m["t"] - time.time()) < 3600
    assert m["devices"] == [stats.summarize(d) for d in replayed]
    assert m["devices"][0]["inactive_split_bytes"] == 7514112
    assert "input_wait_ratio" not in m and "oom" not in m
    assert all(len(line) <= wire.MAX_MESSAGE_BYTES for line in listener.lines)


def test_nothing_is_sent_without_torch_or_a_cuda_device(listener: Listener, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(__import__("sys").modules, "torch", raising=False)
    r = Reporter(listener.path)
    assert r.message() is None and r.tick() is False
    monkeypatch.setitem(__import__("sys").modules, "torch", object())
    monkeypatch.setattr(stats, "read_devices", lambda torch: [])
    assert r.message() is None
    r.stop()


def test_no_daemon_is_silent_and_cheap(tmp_path: Path, replayed: list[stats.RawDevice]) -> None:
    r = Reporter(tmp_path / "nobody.sock")
    assert r.tick() is False and r.errors == 0 and r.sent == 0
    r.stop()


def test_a_failing_torch_never_raises_into_the_script(listener: Listener, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(torch: object) -> list[stats.RawDevice]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setitem(__import__("sys").modules, "torch", object())
    monkeypatch.setattr(stats, "read_devices", broken)
    r = Reporter(listener.path)
    assert r.tick() is False and r.errors == 1
    monkeypatch.setattr(stats, "read_devices", lambda torch: [stats.RawDevice(0, None, {"num_ooms": 1})])
    assert r.tick() is True
    m = wait_for(listener.messages, "the report after the failure")[0]
    r.stop()
    assert m["client_errors"] == 1 and m["devices"] == [{"index": 0, "ooms": 1}]


def test_an_oom_is_sent_at_once_with_its_request(listener: Listener, replayed: list[stats.RawDevice]) -> None:
    r = Reporter(listener.path, interval=3600)
    r.start()
    r.on_oom(0, 2 << 30, 15 << 30, 1 << 30)  # torch's observer signature: device, alloc, device_alloc, device_free
    m = wait_for(listener.messages, "the OOM report")[0]
    r.stop()
    assert m["oom"] == {"device": 0, "requested_bytes": 2 << 30, "device_allocated_bytes": 15 << 30,
                        "device_free_bytes": 1 << 30}


def test_reconnects_after_the_daemon_restarts(tmp_path: Path, replayed: list[stats.RawDevice]) -> None:
    path = tmp_path / "training.sock"
    first = Listener(path)
    r = Reporter(path)
    assert r.tick()
    wait_for(first.messages, "the first report")
    first.close()
    path.unlink()
    second = Listener(path)
    try:
        wait_for(lambda: r.tick() and second.messages(), "a report to the restarted daemon")
    finally:
        r.stop()
        second.close()


def test_input_wait_ratio_is_the_share_of_wall_time_spent_in_next() -> None:
    now = [0.0]
    meter = input_wait.InputWaitMeter(clock=lambda: now[0])

    class Slow:
        def __iter__(self) -> Slow:
            return self

        def __next__(self) -> int:
            now[0] += 3.0  # the loader takes 3 s per batch
            if now[0] > 20:
                raise StopIteration
            return 1

    for _ in meter.wrap(Slow()):
        now[0] += 1.0  # the step computes for 1 s
    # the window starts at the first wait: batches at 0-3, 4-7, ..., 16-19, the end of the data found at 23
    assert meter.take() == pytest.approx(15.0 / 23.0)
    assert meter.take() is None  # nothing fetched since


def test_the_socket_is_found_where_the_daemon_puts_it(tmp_path: Path) -> None:
    assert default_socket({wire.SOCKET_ENV: "/x/y.sock"}) == Path("/x/y.sock")
    (tmp_path / "gpuwatchd").mkdir()
    (tmp_path / "gpuwatchd" / "training.sock").touch()
    found = default_socket({"XDG_RUNTIME_DIR": str(tmp_path)})
    expected = Path("/run/gpuwatchd/training.sock")
    assert found == (expected if expected.exists() else tmp_path / "gpuwatchd" / "training.sock")
    assert default_socket({}) == expected


def test_reports_share_one_connection(listener: Listener, replayed: list[stats.RawDevice]) -> None:
    r = Reporter(listener.path)
    for _ in range(5):
        assert r.tick()
    wait_for(lambda: len(listener.messages()) == 5, "five reports")
    r.stop()
    assert listener.connections == 1  # the check for a closed daemon must not close a live connection
