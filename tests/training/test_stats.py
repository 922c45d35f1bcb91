"""The client's reading of torch.cuda.memory_stats(), replayed from dicts PyTorch users published."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from gpuwatchd.training import stats
from tests.training.conftest import RECORDED, recorded


@pytest.mark.parametrize("name", RECORDED)
def test_every_counter_the_dict_has_is_sent_and_nothing_else(name: str) -> None:
    raw = recorded(name)
    out = stats.summarize(stats.RawDevice(0, "GPU-abc", raw))
    expected = {field: raw[key] for key, field in stats.FIELDS.items() if key in raw}
    assert {k: v for k, v in out.items() if k not in ("index", "uuid")} == expected
    assert out["index"] == 0 and out["uuid"] == "GPU-abc"


def test_fragmentation_figures_of_the_minkowski_dump() -> None:
    out = stats.summarize(stats.RawDevice(1, None, recorded("minkowski-359-a.json"), 2 << 30, 16 << 30))
    assert out == {"index": 1, "inactive_split_bytes": 7514112, "alloc_retries": 2, "ooms": 0,
                   "reserved_bytes": 50331648, "free_bytes": 2 << 30, "total_bytes": 16 << 30}


def test_a_dict_without_event_counters_sends_bytes_only() -> None:
    out = stats.summarize(stats.RawDevice(0, None, recorded("torchrec-3580.json")))
    assert out == {"index": 0, "allocated_bytes": 5861, "reserved_bytes": 5866, "active_bytes": 5861}


def test_values_that_are_not_counts_are_left_out() -> None:
    raw = {"allocated_bytes.all.current": -1, "reserved_bytes.all.current": "12", "num_ooms": True,
           "num_alloc_retries": 3.5, "active_bytes.all.current": 7}
    assert stats.summarize(stats.RawDevice(0, "", raw)) == {"index": 0, "active_bytes": 7}


def test_uuids_are_spelled_as_nvml_spells_them() -> None:
    assert stats.gpu_uuid(SimpleNamespace(uuid="6e0bd3b5-1a2b-3c4d-5e6f-00112233aabb")) == \
        "GPU-6e0bd3b5-1a2b-3c4d-5e6f-00112233aabb"
    assert stats.gpu_uuid(SimpleNamespace(uuid="MIG-1234")) == "MIG-1234"
    assert stats.gpu_uuid(SimpleNamespace()) is None
    assert stats.gpu_uuid(SimpleNamespace(uuid="")) is None


def test_the_cpu_build_reports_no_device_and_creates_no_context() -> None:
    torch = importlib.import_module("torch")
    assert torch.cuda.memory_stats.__module__ == "torch.cuda.memory"  # the API read_devices calls exists
    assert stats.read_devices(torch) == []


class _FakeCuda:
    """torch.cuda's surface as read_devices uses it, replaying recorded dicts per device: device 1 is unused."""

    def __init__(self) -> None:
        self.info_calls: list[int] = []
        self.dicts = [recorded("minkowski-359-a.json"), recorded("rocm-703.json")]

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return 2

    def memory_stats(self, i: int) -> dict[str, int]:
        return self.dicts[i]

    def mem_get_info(self, i: int) -> tuple[int, int]:
        self.info_calls.append(i)
        return (1 << 30, 8 << 30)

    def get_device_properties(self, i: int) -> SimpleNamespace:
        return SimpleNamespace(uuid=f"0000000{i}-0000-0000-0000-000000000000")


def test_only_devices_with_reserved_memory_are_read() -> None:
    cuda = _FakeCuda()
    devices = stats.read_devices(SimpleNamespace(cuda=cuda))
    assert [(d.index, d.uuid, d.free_bytes) for d in devices] == [
        (0, "GPU-00000000-0000-0000-0000-000000000000", 1 << 30)]
    assert cuda.info_calls == [0]  # mem_get_info on the unused device 1 would create a context there
