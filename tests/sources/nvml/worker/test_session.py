"""The worker's poll through the real pynvml and the stand-in, in this process: GPUs set aside by the watchdog."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatchd.sim.state import make_device, make_state
from gpuwatchd.sources.nvml.protocol import HANG_SUSPECTED, NOT_IN_A_GPU_CALL
from tests.sources.conftest import InProcessNvml


def _worker(inprocess_nvml: InProcessNvml, n: int, **device: Any) -> Any:
    from gpuwatchd.sources.nvml.worker.session import Worker

    inprocess_nvml(make_state(0, devices=[make_device(i, **device) for i in range(n)]))
    w = Worker(10, None)
    w.start()
    first = w.poll()
    assert first is not None and [g["index"] for g in first["gpus"]] == list(range(n))
    return w


def _set_aside(w: Any, index: int) -> Any:
    """What the watchdog does when the poller has been in GPU ``index``'s calls too long; the abandoned position."""
    old = w.pos
    old.index = index
    assert w.set_aside(old, 0.3) is not None
    return old


def test_a_set_aside_gpu_is_reported_suspected_not_left_out(inprocess_nvml: InProcessNvml) -> None:
    w = _worker(inprocess_nvml, 3)
    _set_aside(w, 1)
    snap = w.poll()
    assert snap is not None
    assert [g["index"] for g in snap["gpus"]] == [0, 2]
    assert [(x["index"], x["reason"]) for x in snap["lost"]] == [(1, HANG_SUSPECTED)]
    w.close()


def test_a_call_that_returns_mid_poll_still_leaves_its_gpu_accounted_for(inprocess_nvml: InProcessNvml) -> None:
    # The race behind a false GpuRemoved under CPU load: the new poller skips GPU 1 (set aside), then the abandoned
    # poller comes back from its call on GPU 1 while the new poll is still on GPU 2. GPU 1 must be in the lost list
    # (suspected) of that snapshot: a successful snapshot without a GPU anywhere says the GPU was removed.
    w = _worker(inprocess_nvml, 3)
    old = _set_aside(w, 1)
    gpu2 = next(d for d in w.devices if d.index == 2)
    poll = gpu2.readings.poll

    def returns_meanwhile(out: dict[str, Any], errors: dict[str, str]) -> None:
        old.index = NOT_IN_A_GPU_CALL
        w._answered(old)  # what the abandoned poller does when its call on GPU 1 returns
        poll(out, errors)

    gpu2.readings.poll = returns_meanwhile
    snap = w.poll()
    assert snap is not None
    assert [g["index"] for g in snap["gpus"]] == [0, 2]
    assert [(x["index"], x["reason"]) for x in snap["lost"]] == [(1, HANG_SUSPECTED)]
    gpu2.readings.poll = poll
    snap = w.poll()  # and the poll after that reads it again
    assert snap is not None and [g["index"] for g in snap["gpus"]] == [0, 1, 2] and "lost" not in snap
    w.close()


def test_the_watchdog_cannot_blame_a_gpu_the_poller_has_left(inprocess_nvml: InProcessNvml,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Host work after the GPUs' calls (resolving the processes' names) is no GPU's call: a watchdog verdict then
    # finds the poller outside every GPU. Before, the position still named the last GPU, which was set aside while
    # this poll went on and was sent anyway (dropped as stale); no abandoned call was left to end the set-aside, so
    # the GPU was skipped, then shown hung and lost, until a retry worker freed it.
    from gpuwatchd.sources.nvml.worker import session as nvml_session

    w = _worker(inprocess_nvml, 2, processes={"compute": [{"pid": 4242, "used_memory": 1 << 20}], "graphics": []})
    resolve = nvml_session.process_dicts_per_gpu
    verdicts: list[object] = []

    def slow_resolve(*args: Any) -> Any:
        verdicts.append(w.set_aside(w.pos, 0.3))
        return resolve(*args)

    monkeypatch.setattr(nvml_session, "process_dicts_per_gpu", slow_resolve)
    snap = w.poll()
    assert verdicts == [None] and w.stuck == {}
    assert snap is not None and [g["index"] for g in snap["gpus"]] == [0, 1] and "lost" not in snap
    w.close()


def test_a_poller_set_aside_between_two_gpus_ends_its_set_aside(inprocess_nvml: InProcessNvml) -> None:
    # The verdict lands after GPU 0's readings, before the step to GPU 1: GPU 0 is blamed (the poller was still
    # in it), the poll is abandoned at that step, and the set-aside ends there; the next poller reads both.
    w = _worker(inprocess_nvml, 2)
    gpu0 = next(d for d in w.devices if d.index == 0)
    poll = gpu0.readings.poll
    new: list[Any] = []

    def then_set_aside(out: dict[str, Any], errors: dict[str, str]) -> None:
        poll(out, errors)
        new.append(w.set_aside(w.pos, 0.3))

    gpu0.readings.poll = then_set_aside
    old_gen = w.gen
    assert w.poll() is None
    gpu0.readings.poll = poll
    assert new[0] is not None and w.gen == old_gen + 1 and w.stuck == {}
    snap = w.poll(new[0])
    assert snap is not None and [g["index"] for g in snap["gpus"]] == [0, 1] and "lost" not in snap
    w.close()
