"""NVML events from the stand-in: Xid delivery, once per set, timeouts, registration rules, a lost GPU."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest

from gpuwatchd.sim.state import make_device, make_state, write_state

if TYPE_CHECKING:
    from conftest import Sim

XID = 0x8  # nvmlEventTypeXidCriticalError


def _with_events(n_gpus: int, events: list[dict[str, Any]], **dev0: Any) -> dict[str, Any]:
    state = make_state(n_gpus, events=events)
    state["devices"][0].update(dev0)
    return state


def test_xid_delivered_once_per_set_then_timeout(sim: Sim) -> None:
    n = sim.nvml
    n.nvmlInit()
    h0, h1 = sim.handles()
    uuid0 = sim.state["devices"][0]["uuid"]
    a, b = n.nvmlEventSetCreate(), n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(h0, XID, a)
    n.nvmlDeviceRegisterEvents(h0, XID, b)
    n.nvmlDeviceRegisterEvents(h1, XID, a)
    with pytest.raises(n.NVMLError_Timeout):
        n.nvmlEventSetWait(a, 0)
    sim.update(_with_events(2, [{"seq": 1, "uuid": uuid0, "type": "xid", "data": 79},
                                {"seq": 2, "uuid": uuid0, "type": "xid", "data": 999}]))  # fmt: skip
    got = [n.nvmlEventSetWait(a, 1000) for _ in range(2)]
    assert [(e.eventType, e.eventData) for e in got] == [(XID, 79), (XID, 999)]  # 999 = unknown Xid
    assert n.nvmlDeviceGetUUID(got[0].device) == uuid0
    assert (got[0].gpuInstanceId, got[0].computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    with pytest.raises(n.NVMLError_Timeout):
        n.nvmlEventSetWait(a, 20)  # each event once per set
    assert n.nvmlEventSetWait(b, 0).eventData == 79  # ...and once for every set
    n.nvmlEventSetFree(a)
    n.nvmlEventSetFree(b)


def test_only_registered_devices_types_and_later_events(sim: Sim) -> None:
    n = sim.nvml
    uuids = [d["uuid"] for d in sim.state["devices"]]
    early = [{"seq": 1, "uuid": uuids[0], "type": "xid", "data": 13}]
    sim.update(_with_events(2, early))
    n.nvmlInit()
    h0, _ = sim.handles()
    s = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(h0, XID, s)
    later = [
        *early,  # queued before registration: never delivered ("events before registration are not recorded")
        {"seq": 2, "uuid": uuids[1], "type": "xid", "data": 31},  # device not registered
        {"seq": 3, "uuid": uuids[0], "type": "dbe", "data": 0},  # type not registered
        {"seq": 4, "uuid": uuids[0], "type": "xid", "data": 48},
    ]
    sim.update(_with_events(2, later))
    ev = n.nvmlEventSetWait(s, 100)
    assert (ev.eventType, ev.eventData) == (XID, 48)
    with pytest.raises(n.NVMLError_Timeout):
        n.nvmlEventSetWait(s, 0)
    n.nvmlEventSetFree(s)


@pytest.mark.timeout(30)
def test_event_injected_while_waiting_is_delivered(sim: Sim) -> None:
    n = sim.nvml
    n.nvmlInit()
    h0, _ = sim.handles()
    s = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(h0, XID, s)
    state = _with_events(2, [{"seq": 7, "uuid": sim.state["devices"][0]["uuid"], "type": "xid", "data": 79}])
    timer = threading.Timer(0.1, write_state, args=(sim.path, state))
    timer.start()
    try:
        ev = n.nvmlEventSetWait(s, 10_000)  # returns as soon as the state carries the event
    finally:
        timer.join()
    assert ev.eventData == 79
    n.nvmlEventSetFree(s)


def test_wait_reports_a_lost_registered_gpu(sim: Sim) -> None:
    n = sim.nvml
    n.nvmlInit()
    h0, _ = sim.handles()
    s = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(h0, XID, s)
    state = make_state(2)
    state["devices"][0]["lost"] = True
    sim.update(state)
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlEventSetWait(s, 1000)
    del state["devices"][0]  # fell off the bus entirely: same answer
    sim.update(state)
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlEventSetWait(s, 1000)
    n.nvmlEventSetFree(s)


def test_register_unsupported_types(sim: Sim) -> None:
    n = sim.nvml
    devices = [make_device(0, supported_event_types=XID), make_device(1, supported_event_types=None)]
    sim.update(make_state(0, devices=devices))
    n.nvmlInit()
    h0, h1 = sim.handles()
    s = n.nvmlEventSetCreate()
    assert n.nvmlDeviceGetSupportedEventTypes(h0) == XID
    with pytest.raises(n.NVMLError_NotSupported):  # asks for a type the GPU lacks: nothing registered
        n.nvmlDeviceRegisterEvents(h0, XID | 0x1, s)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceRegisterEvents(h1, XID, s)
    n.nvmlDeviceRegisterEvents(h0, XID, s)
    n.nvmlEventSetFree(s)


def test_default_supported_types_are_all_bits(sim: Sim) -> None:
    n = sim.nvml
    n.nvmlInit()
    assert n.nvmlDeviceGetSupportedEventTypes(sim.handles()[0]) == n.nvmlEventTypeAll
