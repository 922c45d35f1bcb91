"""status_from_store: the /api/v1/status JSON is complete, JSON-clean, and says nothing made up about gone GPUs."""

from __future__ import annotations

import json

from gpuwatchd.store import Store
from gpuwatchd.web.status import STATUS_VERSION, status_from_store
from tests.exporter.conftest import UUID_A, UUID_B, UUID_C, UUID_D


def test_shape_and_round_trip(mixed_store: Store) -> None:
    data = status_from_store(mixed_store)
    assert json.loads(json.dumps(data)) == data  # only JSON types, no default= needed
    assert data["version"] == STATUS_VERSION
    assert data["nvml"]["ok"] is True and data["nvml"]["worker_restarts"] == 2
    assert data["nvml"]["lost"][0]["uuid"] == UUID_C
    assert [g["uuid"] for g in data["gpus"]] == [UUID_A, UUID_B, UUID_C, UUID_D]
    assert data["sources"]["kmsg"]["error"] == "permission denied: /dev/kmsg"
    xid13 = next(x for x in data["xid_counts"] if (x["uuid"], x["xid"]) == (UUID_A, 13))
    assert xid13["count"] == 2
    assert xid13["catalog"]["immediate_action"] == "RESTART_APP" and xid13["catalog"]["severity"] == "warning"
    assert data["xid_catalog"]["source"].startswith("https://docs.nvidia.com/") and data["xid_catalog"]["version"]
    assert data["config"] == {"last_reload_successful": False, "last_reload_success_timestamp": 1_699_996_400.0}
    assert len(data["links"]) == 3


def test_present_gpu_readings_leave_out_missing_fields(mixed_store: Store) -> None:
    gpus = {g["uuid"]: g for g in status_from_store(mixed_store)["gpus"]}
    b = gpus[UUID_B]
    assert b["readings"]["temperature_celsius"] == 38.0
    assert "ecc_corrected_volatile" not in b["readings"]  # None: not a null that reads like a value
    assert b["readings"]["fan_speed_ratios"] == [0.3, 0.31]
    assert b["errors"] == {"power_max_limit_watts": "no_permission"}
    a = gpus[UUID_A]
    assert a["readings"]["clocks_event_reasons_active"] == ["sw_power_cap", "hw_slowdown"]
    assert [p["pid"] for p in a["processes"]] == [4242, 4242, 5151]
    assert a["processes_total"] == 3


def test_gone_gpus_have_state_and_no_readings(mixed_store: Store) -> None:
    gpus = {g["uuid"]: g for g in status_from_store(mixed_store)["gpus"]}
    assert (gpus[UUID_C]["state"], gpus[UUID_D]["state"]) == ("lost", "removed")
    for uuid in (UUID_C, UUID_D):
        assert gpus[uuid]["readings"] is None and gpus[uuid]["processes"] == []
        assert gpus[uuid]["last_seen"] == 1_700_000_000.0
    assert gpus[UUID_C]["since"] == 1_700_000_030.0


def test_empty_store() -> None:
    data = status_from_store(Store())
    assert data["nvml"]["ok"] is None and data["gpus"] == [] and data["xid_counts"] == []
