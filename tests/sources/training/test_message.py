"""A client's line into store events: schema 1 checked field by field, devices matched to the GPUs NVML lists."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuwatchd.sources.training.message import MAX_DEVICES, Refused, parse
from gpuwatchd.training import stats
from tests.training.conftest import RECORDED, recorded

A, B = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"


def line(**msg: Any) -> bytes:
    return json.dumps({"v": 1, "pid": 7, "t": 0.0, **msg}).encode() + b"\n"


@pytest.mark.parametrize("name", RECORDED)
def test_the_client_s_own_summary_of_recorded_dicts_is_taken_whole(name: str) -> None:
    entry = stats.summarize(stats.RawDevice(0, A, recorded(name), 5, 10))
    (r,) = parse(line(devices=[entry]), 4242, {A, B}, 100.0).reports
    assert (r.uuid, r.pid, r.timestamp) == (A, 4242, 100.0)  # the kernel's pid, not the one the client claims
    for field in ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "alloc_retries",
                  "ooms", "device_allocs", "device_frees", "free_bytes", "total_bytes"):
        assert getattr(r, field) == entry.get(field), field


def test_a_device_without_uuid_is_attributed_only_when_the_process_is_on_one_gpu() -> None:
    dev = [{"index": 0, "allocated_bytes": 1}]
    assert parse(line(devices=dev), 1, {A}, 0.0).reports[0].uuid == A
    p = parse(line(devices=dev), 1, {A, B}, 0.0)
    assert p.reports == () and p.unmatched == 1


def test_a_gpu_the_process_is_not_on_is_dropped_and_counted() -> None:
    p = parse(line(devices=[{"uuid": B, "allocated_bytes": 1}, {"uuid": A, "allocated_bytes": 2},
                            {"uuid": A, "allocated_bytes": 3}]), 1, {A}, 0.0)
    assert [(r.uuid, r.allocated_bytes) for r in p.reports] == [(A, 2)] and p.unmatched == 2


@pytest.mark.parametrize(("data", "reason"), [
    (b"\xff\xfe\n", "malformed"),
    (b"[1, 2]\n", "malformed"),
    (b'{"v": 1, "devices": {}}\n', "malformed"),
    (b'{"v": 1, "devices": [1]}\n', "malformed"),
    (b'{"v": 2, "devices": []}\n', "unsupported_version"),
    (b'{"devices": []}\n', "unsupported_version"),
    (b"[" * 100_000 + b"\n", "malformed"),
    (json.dumps({"v": 1, "devices": [{}] * (MAX_DEVICES + 1)}).encode(), "malformed"),
])
def test_lines_that_are_not_schema_1_are_refused(data: bytes, reason: str) -> None:
    with pytest.raises(Refused) as e:
        parse(data, 1, {A}, 0.0)
    assert e.value.reason == reason


def test_a_process_without_a_gpu_context_is_refused() -> None:
    with pytest.raises(Refused) as e:
        parse(line(devices=[{"uuid": A}]), 1, set(), 0.0)
    assert e.value.reason == "no_gpu_context"


def test_values_out_of_range_or_of_the_wrong_type_are_unknown_not_errors() -> None:
    dev = {"uuid": A, "allocated_bytes": -5, "reserved_bytes": 1 << 70, "ooms": True, "alloc_retries": "3",
           "inactive_split_bytes": 1.5, "active_bytes": None, "extra": {"x": 1}}
    (r,) = parse(line(devices=[dev], input_wait_ratio=1.5), 1, {A}, 0.0).reports
    assert (r.allocated_bytes, r.reserved_bytes, r.ooms, r.alloc_retries, r.inactive_split_bytes,
            r.active_bytes, r.input_wait_ratio) == (None,) * 7


def test_input_wait_and_oom_go_with_their_device() -> None:
    msg = line(devices=[{"index": 0, "uuid": A}, {"index": 1, "uuid": B}], input_wait_ratio=0.25,
               oom={"device": 1, "requested_bytes": 2 << 30, "device_allocated_bytes": 5, "device_free_bytes": 6})
    a, b = parse(msg, 1, {A, B}, 9.0).reports
    assert a.oom is None and b.oom is not None and b.oom.requested_bytes == 2 << 30 and b.oom.timestamp == 9.0
    assert a.input_wait_ratio == b.input_wait_ratio == 0.25


def test_the_input_wait_alone_before_cuda_is_used() -> None:
    (r,) = parse(line(devices=[], input_wait_ratio=0.5), 3, {A}, 0.0).reports
    assert (r.uuid, r.input_wait_ratio, r.allocated_bytes) == (A, 0.5, None)
