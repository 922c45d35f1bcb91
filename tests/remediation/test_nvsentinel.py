"""Health events to NVSentinel's platform connector: a real gRPC server built from our hand-written proto (as
the kubelet's pod-resources tests do), its wire numbers pinned against NVSentinel's, the stubs checked against their
generator, failures as values."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatchd.config.types import validate
from gpuwatchd.model import GpuSample, HealthChange, Snapshot
from gpuwatchd.model.health import GpuHealth
from gpuwatchd.remediation.config import RemediationConfig
from gpuwatchd.remediation.nvsentinel import RECOMMENDED
from gpuwatchd.remediation.nvsentinel_pb import health_event_pb2 as pb
from gpuwatchd.remediation.service import Remediation
from gpuwatchd.runtime.clock import ManualClock
from gpuwatchd.store import Store

from .platform_connector import serve

ROOT = Path(__file__).resolve().parents[2]
PKG = "gpuwatchd/remediation/nvsentinel_pb"
STUBS = ("health_event_pb2.py", "health_event_pb2.pyi", "health_event_pb2_grpc.py")
U0 = "GPU-11111111-2222-3333-4444-555555555555"
LOST = GpuHealth("unhealthy", "GPU 0 lost (fell off the bus)", "reboot", 0.0, ("GpuLost", "GpuXidError"))
THROTTLED = GpuHealth("degraded", "HW slowdown 80 % of the last 30 s", "inspect_hardware", 0.0, ("GpuThrottled",))
HEALTHY = GpuHealth("healthy", "no firing alert", "none", 0.0)


def test_committed_stubs_match_the_generator(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    (tmp_path / PKG).mkdir(parents=True)
    shutil.copy(ROOT / PKG / "health_event.proto", tmp_path / PKG / "health_event.proto")
    r = subprocess.run(["sh", str(ROOT / PKG / "generate.sh")], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, check=False,
                       # generate.sh runs `python`: the interpreter running the tests (a venv's) comes first
                       env={**os.environ, "PYTHONPATH": str(ROOT),
                            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])})
    assert r.returncode == 0, r.stderr
    for name in STUBS:
        assert (tmp_path / PKG / name).read_text() == (ROOT / PKG / name).read_text(), name
    assert "264bfab85e3c490468f9239858fa52bb6b977e3f" in (ROOT / PKG / "README.md").read_text()


# What NVSentinel's platform connector expects (its data-models/protobufs/health_event.proto at the commit in
# README.md): per message, field name -> (number, protobuf type, repeated). Our proto must say exactly this: a field
# added here is one checked against NVSentinel's schema first.
WIRE = {
    "HealthEvents": {"version": (1, "uint32", False), "events": (2, "message", True)},
    "HealthEvent": {
        "version": (1, "uint32", False), "agent": (2, "string", False), "componentClass": (3, "string", False),
        "checkName": (4, "string", False), "isFatal": (5, "bool", False), "isHealthy": (6, "bool", False),
        "message": (7, "string", False), "recommendedAction": (8, "enum", False),
        "entitiesImpacted": (10, "message", True), "metadata": (11, "message", True),
        "generatedTimestamp": (12, "message", False), "nodeName": (13, "string", False),
        "processingStrategy": (16, "enum", False),
    },
    "Entity": {"entityType": (1, "string", False), "entityValue": (2, "string", False)},
}
ENUMS = {
    "RecommendedAction": {"NONE": 0, "COMPONENT_RESET": 2, "CONTACT_SUPPORT": 5, "RESTART_BM": 24, "RESTART_APP": 39,
                          "UNKNOWN": 99},
    "ProcessingStrategy": {"UNSPECIFIED": 0, "EXECUTE_REMEDIATION": 1, "STORE_ONLY": 2},
}


def test_our_proto_keeps_nvsentinels_wire_numbers() -> None:
    from google.protobuf.descriptor import FieldDescriptor

    types = {FieldDescriptor.TYPE_UINT32: "uint32", FieldDescriptor.TYPE_STRING: "string",
             FieldDescriptor.TYPE_BOOL: "bool", FieldDescriptor.TYPE_ENUM: "enum",
             FieldDescriptor.TYPE_MESSAGE: "message"}
    d = pb.DESCRIPTOR
    assert d.package == "datamodels"
    service = d.services_by_name["PlatformConnector"]
    method = service.methods_by_name["HealthEventOccurredV1"]
    assert f"/{service.full_name}/{method.name}" == "/datamodels.PlatformConnector/HealthEventOccurredV1"  # grpc's path
    assert (method.input_type.full_name, method.output_type.full_name) == \
        ("datamodels.HealthEvents", "google.protobuf.Empty")
    assert set(d.message_types_by_name) == set(WIRE)
    for name, fields in WIRE.items():
        got = {f.name: (f.number, types.get(f.type, str(f.type)), f.is_repeated)
               for f in d.message_types_by_name[name].fields}
        assert got == fields, name
    event = d.message_types_by_name["HealthEvent"].fields_by_name
    assert event["metadata"].message_type.GetOptions().map_entry
    assert [(f.name, types.get(f.type)) for f in event["metadata"].message_type.fields] == \
        [("key", "string"), ("value", "string")]
    assert event["generatedTimestamp"].message_type.full_name == "google.protobuf.Timestamp"
    assert event["recommendedAction"].enum_type.name == "RecommendedAction"
    assert event["processingStrategy"].enum_type.name == "ProcessingStrategy"
    assert {e.name: {v.name: v.number for v in e.values} for e in d.enum_types_by_name.values()} == ENUMS
    # every action gpuwatchd recommends is one of them
    assert set(RECOMMENDED.values()) <= set(ENUMS["RecommendedAction"])
    # the tag NVSentinel reads for processingStrategy: field 16, varint -> 0x80 0x01, then STORE_ONLY (2)
    assert pb.HealthEvent(processingStrategy=pb.STORE_ONLY).SerializeToString() == b"\x80\x01\x02"


def _remediation(tmp_path: Path, sock: Path, **nv: object) -> tuple[Remediation, Store, ManualClock]:
    clock, store = ManualClock(), Store()
    gpu = GpuSample(uuid=U0, index=0, name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0",
                    serial="1650924060039")
    store.apply(Snapshot(timestamp=clock.now(), nvml_ok=True, gpus=(gpu,)))
    cfg = validate(RemediationConfig, {"nvsentinel": {"enabled": True, "socket": str(sock), "node_name": "node-17",
                                                      "retry_interval": "10s", **nv}})
    return Remediation(cfg, store, clock, tmp_path, host="h1", boot_id="b1"), store, clock


async def _tick(r: Remediation, store: Store, h: GpuHealth) -> None:
    store.ingest(HealthChange({U0: h}))
    await r.tick()


async def test_health_changes_become_health_events(tmp_path: Path) -> None:
    sock = tmp_path / "nvsentinel.sock"
    with serve(sock) as connector:
        r, store, clock = _remediation(tmp_path, sock)
        await _tick(r, store, HEALTHY)  # the first word about a GPU: healthy
        await _tick(r, store, HEALTHY)  # no change, no event
        first = connector.events()
        assert [(e.checkName, e.isHealthy) for e in first] == [("GpuHealth", True)]
        clock.advance(5.0)
        await _tick(r, store, LOST)
        await _tick(r, store, THROTTLED)
        await _tick(r, store, HEALTHY)
        events = connector.events()[1:]
    lost = [e for e in events if not e.isHealthy and e.isFatal]
    assert [e.checkName for e in lost] == ["GpuLost", "GpuXidError"]
    e = lost[0]
    assert e.agent == "gpuwatchd" and e.componentClass == "GPU" and e.nodeName == "node-17" and e.version == 1
    assert e.recommendedAction == pb.RESTART_BM and e.processingStrategy == pb.EXECUTE_REMEDIATION
    assert [(x.entityType, x.entityValue) for x in e.entitiesImpacted] == [("GPU", "0"), ("GPU_UUID", U0)]
    assert e.metadata["SerialNumber"] == "1650924060039" and e.metadata["uuid"] == U0
    assert e.message.startswith("GPU 0 lost (fell off the bus); to do: reboot the machine")
    assert e.generatedTimestamp.ToNanoseconds() == int((1_700_000_005.0) * 1e9)
    degraded = [x for x in events if x.checkName == "GpuThrottled" and not x.isHealthy]
    assert len(degraded) == 1 and not degraded[0].isFatal and degraded[0].recommendedAction == pb.CONTACT_SUPPORT
    # Lost -> throttled: NVSentinel is told the two fatal checks are over, then the new one.
    assert [(x.checkName, x.isHealthy) for x in events[2:5]] == [("GpuLost", True), ("GpuXidError", True),
                                                                ("GpuThrottled", False)]
    # Recovery clears what NVSentinel holds as failing: the degraded event came last, so GpuThrottled.
    cleared = [(x.checkName, x.isHealthy) for x in events[-1:]]
    assert cleared == [("GpuThrottled", True)]
    text = r.counters.actions
    assert text[("nvsentinel", "event", "ok")] == len(events) + 1


async def test_dry_run_is_store_only(tmp_path: Path) -> None:
    sock = tmp_path / "nvsentinel.sock"
    with serve(sock) as connector:
        r, store, _ = _remediation(tmp_path, sock, dry_run=True)
        await _tick(r, store, LOST)
        events = connector.events()
    assert events and all(e.processingStrategy == pb.STORE_ONLY for e in events)
    assert r.counters.actions[("nvsentinel", "event", "dry_run")] == 2


async def test_absent_socket_and_failing_connector_are_counted_and_retried(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sock = tmp_path / "nvsentinel.sock"
    caplog.set_level(logging.INFO)
    r, store, clock = _remediation(tmp_path, sock, timeout="2s")
    for _ in range(3):
        await _tick(r, store, LOST)
        clock.advance(11.0)
    assert r.counters.errors[("nvsentinel", "missing")] == 3 and r.counters.up["nvsentinel"] is False
    assert len([x for x in caplog.records if "cannot send health events" in x.getMessage()]) == 1
    with serve(sock) as connector:
        connector.fail = __import__("grpc").StatusCode.UNAVAILABLE
        await _tick(r, store, LOST)
        assert r.counters.errors[("nvsentinel", "failed")] == 1
        await _tick(r, store, LOST)  # within retry_interval: not tried again
        assert r.counters.errors[("nvsentinel", "failed")] == 1
        connector.fail = None
        clock.advance(11.0)
        await _tick(r, store, LOST)
        events = connector.events()
    assert [e.checkName for e in events] == ["GpuLost", "GpuXidError"]  # the latest state, once, not a backlog
    assert r.counters.up["nvsentinel"] is True
    assert any("reach" in x.getMessage() and "again" in x.getMessage() for x in caplog.records)
