"""NvmlSupervisor failure paths and what they log: one line per episode, repeats at DEBUG, one line when over.

Real worker processes against the stand-in driver; where the failure is the worker's own (a Python traceback),
a real interpreter plays the worker.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.sim.state import make_device, make_state
from gpuwatchd.sources.nvml import stderr_relay, supervisor, worker_process

from .test_supervisor import Harness, _children, fast_nvml

StateWriter = Callable[[dict[str, Any]], Path]
LOGGER = "gpuwatchd.sources.nvml.supervisor"


def records(caplog: pytest.LogCaptureFixture, level: int, text: str = "") -> list[str]:
    """Messages logged by gpuwatchd at exactly ``level`` that contain ``text``."""
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("gpuwatchd") and r.levelno == level and text in r.getMessage()]


async def test_hang_episode_is_one_warning_and_one_recovery_line(
    standin_libdir: Path, write_sim_state: StateWriter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpuwatchd")
    healthy = make_state(2)
    hung = make_state(2)
    hung["devices"][1]["delays_ms"] = {"*": -1}  # GPU 1's calls block, as in a wedged driver
    path = write_sim_state(healthy)
    async with Harness(fast_nvml(standin_libdir, poll_timeout=0.6), path, tmp_path) as h:
        uuid = (await h.next_snapshot()).gpus[1].uuid
        write_sim_state(hung)
        await h.next_snapshot(lambda s: any(x.reason == "timeout" for x in s.lost), "GPU 1 hung")
        start = len(h.snaps)
        await h.until(lambda: len(h.snaps) >= start + 10, "ten more polls of GPU 0 during the hang")
        warnings = records(caplog, logging.WARNING)
        aside = records(caplog, logging.INFO, "set aside")
        write_sim_state(healthy)
        await h.next_snapshot(lambda s: s.nvml_ok and len(s.gpus) == 2, "GPU 1 answering again")
        back = records(caplog, logging.INFO, "answers NVML calls again")
    assert aside == [f"GPU 1 ({uuid}): an NVML call has blocked for more than 0.25s; it is set aside (hang "
                     "suspected) while the other GPUs keep reporting"]
    assert len(warnings) == 1, warnings  # not one per poll, and nothing else warns
    assert warnings[0].startswith(f"GPU 1 ({uuid}) blocked an NVML call for more than 0.6s while the other GPUs "
                                  "answered: shown lost (reason timeout)")
    assert len(back) == 1 and back[0].startswith(f"GPU 1 ({uuid}) answers NVML calls again after ")
    assert h.sup.hangs == {} and h.stale == [] and h.sup.spawned == 1


async def test_suspected_hang_that_ends_is_never_a_loss(
    standin_libdir: Path, write_sim_state: StateWriter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpuwatchd")
    state = make_state(2)
    path = write_sim_state(state)
    async with Harness(fast_nvml(standin_libdir, poll_timeout=30.0), path, tmp_path) as h:
        uuid = (await h.next_snapshot()).gpus[1].uuid
        state["devices"][1]["delays_ms"] = {"*": -1}
        write_sim_state(state)
        await h.next_snapshot(lambda s: bool(s.lost), "GPU 1 set aside")
        start = len(h.snaps)
        await h.until(lambda: len(h.snaps) >= start + 5, "polls while it is suspected")
        assert h.store.presence[uuid].state == "present"  # a guess: no GpuLost
        held = h.store.gpu(uuid)
        assert held is not None and held.temperature_celsius is not None  # its last readings are held
        state["devices"][1]["delays_ms"] = {}
        write_sim_state(state)
        await h.next_snapshot(lambda s: len(s.gpus) == 2, "GPU 1 answering again")
    assert {x.reason for s in h.snaps for x in s.lost} == {"hang_suspected"}
    assert records(caplog, logging.WARNING) == []
    assert records(caplog, logging.INFO, "(it was only suspected)") != []
    assert all(p.state == "present" for p in h.store.presence.values())


async def test_gpu_hanging_at_enumeration_is_named_by_index(
    standin_libdir: Path, write_sim_state: StateWriter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpuwatchd")
    state = make_state(2)
    state["devices"][1]["delays_ms"] = {"nvmlDeviceGetHandleByIndex_v2": -1}  # never seen: no UUID to name it by
    path = write_sim_state(state)
    async with Harness(fast_nvml(standin_libdir, poll_timeout=0.6), path, tmp_path) as h:
        s = await h.next_snapshot(lambda s: s.nvml_ok, "GPU 0 reporting without GPU 1")
        assert [g.index for g in s.gpus] == [0]
        assert [(x.index, x.uuid) for x in s.lost] == [(1, None)]
        s = await h.next_snapshot(lambda s: any(x.reason == "timeout" for x in s.lost), "GPU 1 hung")
        assert [(x.index, x.uuid, x.reason) for x in s.lost] == [(1, None, "timeout")]
        del state["devices"][1]["delays_ms"]
        write_sim_state(state)
        back = await h.next_snapshot(lambda s: len(s.gpus) == 2, "GPU 1 enumerated")
    warnings = records(caplog, logging.WARNING)
    assert len(warnings) == 1 and warnings[0].startswith("GPU 1 blocked an NVML call for more than 0.6s")
    assert records(caplog, logging.INFO, f"GPU 1 ({back.gpus[1].uuid}) answers NVML calls again") != []
    assert h.stale == [] and h.sup.spawned == 1


async def test_repeated_worker_warning_is_relayed_once(
    standin_libdir: Path, write_sim_state: StateWriter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpuwatchd")
    state = make_state(1, devices=[make_device(0, errors={"nvmlDeviceRegisterEvents": "UNKNOWN"})])
    async with Harness(fast_nvml(standin_libdir), write_sim_state(state), tmp_path) as h:
        for n in range(1, 4):
            await h.until(lambda n=n: h.sup.spawned >= n, f"worker {n}")  # type: ignore[misc]
            await h.next_snapshot()  # the worker registered events (and complained) before its first poll
            h.sup.request_restart("test")
        await h.until(lambda: h.sup.spawned >= 4, "the fourth worker")
    uuid = state["devices"][0]["uuid"]
    line = f"GPU {uuid}: Xid events not registered: unknown"
    assert [m.split(": ", 1)[1] for m in records(caplog, logging.WARNING)] == [line]
    assert sum(m.endswith(line) for m in records(caplog, logging.DEBUG)) >= 2
    assert records(caplog, logging.WARNING)[0].startswith("nvml_worker[")


async def test_worker_traceback_is_one_block_and_named_in_the_exit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpuwatchd")
    fake = tmp_path / "crashing-python"
    code = "import json; print(json.dumps({'hello': 1}), flush=True); raise RuntimeError('driver said: boom')"
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} -c "{code}"\n')
    fake.chmod(0o755)
    async with Harness(fast_nvml(None), tmp_path / "state", tmp_path, python=str(fake)) as h:
        await h.until(lambda: len(h.stale) >= 3, "three crashed workers")
    assert h.stale[0] == "NVML worker exited unexpectedly (worker_exit_1): RuntimeError: driver said: boom"
    assert h.sup.last_error == "worker_exit_1"
    warnings = records(caplog, logging.WARNING)
    assert len(warnings) == 2, warnings  # the traceback once, the failure once: not per crashed worker
    block = next(w for w in warnings if w.startswith("unexpected output from the NVML worker"))
    assert block.splitlines()[1] == "Traceback (most recent call last):"
    assert block.splitlines()[-1] == "RuntimeError: driver said: boom"
    assert any(w.startswith("NVML data stale: NVML worker exited unexpectedly (worker_exit_1)") for w in warnings)
    assert len(records(caplog, logging.DEBUG, "NVML data stale again")) >= 2


async def test_failure_episode_ends_with_one_line(
    standin_libdir: Path, write_sim_state: StateWriter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpuwatchd")
    async with Harness(fast_nvml(standin_libdir), write_sim_state(make_state(1)), tmp_path) as h:
        for _ in range(2):
            await h.next_snapshot()
            proc = h.sup._proc
            assert proc is not None
            proc.kill()  # as if the driver segfaulted the worker, twice in a row
            await h.until(lambda p=proc: p.returncode is not None and h.sup._proc is not p,  # type: ignore[misc]
                          "the crash noticed")
        start = len(h.snaps)
        await h.until(lambda: len(h.snaps) >= start + supervisor.HEALTHY_POLLS_TO_RESET_BACKOFF, "a healthy run")
    warnings = records(caplog, logging.WARNING)
    assert warnings == ["NVML data stale: NVML worker exited unexpectedly (worker_signal_9)"]
    assert records(caplog, logging.INFO, "NVML data fresh again") == [
        "NVML data fresh again after 2 failed worker(s) (last failure: worker_signal_9)"
    ]


async def test_oversized_line_replaces_the_worker(
    standin_libdir: Path, write_sim_state: StateWriter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 64 MB is the real bound; 4 KB with 40 processes exercises the same path through a real worker
    monkeypatch.setattr(worker_process, "MAX_LINE_BYTES", 4096)
    procs = [{"pid": 100 + i, "used_memory": 1_000_000 + i, "name": "python3"} for i in range(40)]
    state = make_state(1, devices=[make_device(0, processes={"compute": procs, "graphics": []})])
    async with Harness(fast_nvml(standin_libdir), write_sim_state(state), tmp_path, top_n=40) as h:
        await h.until(lambda: len(h.stale) >= 2, "two oversized lines")
    assert h.stale[0] == "worker wrote an oversized line"
    assert h.sup.last_error == "protocol_error" and h.snaps == []
    assert records(caplog, logging.WARNING) == ["NVML data stale: worker wrote an oversized line"]


async def test_worker_that_never_starts_is_killed_even_if_it_ignores_term(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # 30 s is the real start-up bound (a loaded box); 0.3 s exercises the same path
    monkeypatch.setattr(supervisor, "STARTUP_TIMEOUT_SECONDS", 0.3)
    fake = tmp_path / "stuck-python"
    fake.write_text("#!/bin/sh\ntrap '' TERM\nwhile :; do sleep 0.05; done\n")  # no hello, deaf to SIGTERM
    fake.chmod(0o755)
    async with Harness(fast_nvml(None, kill_grace=0.2), tmp_path / "state", tmp_path, python=str(fake)) as h:
        await h.until(lambda: len(h.stale) >= 2, "two workers that never started")
    assert h.stale[0] == "timeout: no start from the NVML worker within its deadline"
    assert h.sup.last_error == "timeout" and h.snaps == [] and h.sup.hangs == {}
    assert _children() == []  # SIGKILL after the grace reached the whole process group
    assert records(caplog, logging.WARNING) == ["NVML data stale: timeout: no start from the NVML worker within "
                                                "its deadline"]


async def test_snapshot_of_the_wrong_shape_replaces_the_worker(tmp_path: Path) -> None:
    fake = tmp_path / "odd-python"
    # valid JSON, but a GPU without a uuid: a worker of another version
    fake.write_text('#!/bin/sh\necho \'{"hello": 1}\'\necho \'{"timestamp": 1, "nvml_ok": true, '
                    '"gpus": [{"index": 0}]}\'\nexec sleep 30\n')
    fake.chmod(0o755)
    async with Harness(fast_nvml(None), tmp_path / "state", tmp_path, python=str(fake)) as h:
        await h.until(lambda: len(h.stale) >= 1, "the odd line noticed")
    assert h.stale[0].startswith("unreadable line from the NVML worker: TypeError(") and "uuid" in h.stale[0]
    assert h.sup.last_error == "protocol_error" and h.snaps == []
    assert _children() == []


async def test_overlong_stderr_line_is_dropped_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="gpuwatchd")
    fake = tmp_path / "chatty-python"
    size = 3 * stderr_relay.MAX_LINE_BYTES
    fake.write_text(f"#!/bin/sh\necho '{{\"hello\": 1}}'\nhead -c {size} /dev/zero | tr '\\000' x >&2\necho >&2\n"
                    "echo 'nvml_worker[1] INFO: still here' >&2\nexit 1\n")
    fake.chmod(0o755)
    async with Harness(fast_nvml(None), tmp_path / "state", tmp_path, python=str(fake)) as h:
        await h.until(lambda: len(h.stale) >= 2, "two workers that wrote an overlong stderr line")
    assert h.stale[0] == "NVML worker exited unexpectedly (worker_exit_1)"  # no fragment taken for its last words
    # one warning for the whole line, in the first worker; the second worker's same line is DEBUG
    assert len(records(caplog, logging.WARNING, "too long to relay")) == 1
    assert len(records(caplog, logging.DEBUG, "too long to relay")) >= 1
    assert records(caplog, logging.INFO, "still here") == ["nvml_worker[1]: still here"]  # the relay went on
    assert records(caplog, logging.WARNING, "unexpected output") == []
