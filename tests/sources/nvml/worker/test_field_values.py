"""The kept nvmlDeviceGetFieldValues array: ids and scopes set once, every value type decoded, per-value codes."""

from __future__ import annotations

import ctypes
import struct

import pynvml as N
import pytest

from gpuwatchd.sources.nvml.worker import field_values as fv


def _fake(results: list[tuple[int, int, bytes]]) -> object:
    """A C function stand-in: checks the ids it is handed and writes (valueType, nvmlReturn, value bytes)."""
    seen: list[tuple[int, int]] = []

    def fn(handle: object, count: ctypes.c_int32, buf: ctypes.Array[ctypes.c_char]) -> int:
        for i in range(count.value):
            seen.append(struct.unpack_from("@II", buf, i * 40))
            struct.pack_into("@ii8s", buf, i * 40 + 24, *results[i])
        return N.NVML_SUCCESS

    fn.seen = seen  # type: ignore[attr-defined]
    return fn


def test_values_decoded_by_type_and_per_value_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    results = [
        (N.NVML_VALUE_TYPE_DOUBLE, 0, struct.pack("@d", 1.5)),
        (N.NVML_VALUE_TYPE_UNSIGNED_INT, 0, struct.pack("@I", 2**32 - 1) + b"\xff" * 4),  # upper bytes ignored
        (N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 0, struct.pack("@Q", 2**63)),
        (N.NVML_VALUE_TYPE_SIGNED_LONG_LONG, 0, struct.pack("@q", -5)),
        (N.NVML_VALUE_TYPE_SIGNED_INT, 0, struct.pack("@i", -7) + b"\0" * 4),
        (N.NVML_VALUE_TYPE_UNSIGNED_SHORT, 0, struct.pack("@H", 65535) + b"\0" * 6),
        (N.NVML_VALUE_TYPE_UNSIGNED_INT, N.NVML_ERROR_NOT_SUPPORTED, b"\0" * 8),
        (99, 0, b"\0" * 8),  # a value type this code does not know: no value
    ]
    fake = _fake(results)
    monkeypatch.setattr(N, "_nvmlGetFunctionPointer", lambda name: fake)
    call = fv.FieldValues([1, (138, 7), 3, 4, 5, 6, 7, 8])
    got = list(call.call(None))
    assert got == [(0, 1.5), (0, 2**32 - 1), (0, 2**63), (0, -5), (0, -7), (0, 65535),
                   (N.NVML_ERROR_NOT_SUPPORTED, None), (0, None)]
    assert fake.seen[:3] == [(1, 0), (138, 7), (3, 0)]  # type: ignore[attr-defined]


def test_a_failed_call_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(N, "_nvmlGetFunctionPointer", lambda name: lambda *a: N.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(N.NVMLError) as e:
        list(fv.FieldValues([1]).call(None))
    assert e.value.value == N.NVML_ERROR_GPU_IS_LOST
