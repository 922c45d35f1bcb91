"""One ``nvmlDeviceGetFieldValues`` request kept as a C array between polls (runs only inside the NVML worker).

pynvml's wrapper builds a new ``nvmlFieldValue_t`` array at every call, sets each id through a Python
``__setattr__`` and hands back structs whose every attribute read goes through a Python ``__getattribute__``: at
~90 values per GPU (the NVLink per-link ids) that was most of a poll's CPU (bench/poll.py). Here the array is filled
once per request, the call goes to the symbol from pynvml's own loader (as ``ProcessLister`` does), and the results
are unpacked in C (``struct.iter_unpack``).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Iterator, Sequence

import pynvml as N

TYPE_CHECKING = False  # typing.TYPE_CHECKING, which mypy reads the same, without importing typing (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any

# nvmlFieldValue_t (nvml.h): uint fieldId; uint scopeId; long long timestamp; long long latencyUsec;
# nvmlValueType_t valueType; nvmlReturn_t nvmlReturn; nvmlValue_t value (an 8-byte union) -- 40 bytes.
_IDS = struct.Struct("@II")
_RESULT = struct.Struct("@24xii8s")
assert _RESULT.size == ctypes.sizeof(N.c_nvmlFieldValue_t)
# nvmlValue_t's members by nvmlValueType_t; each one starts at the union's first byte
_DECODE: dict[int, Callable[[bytes], tuple[Any, ...]]] = {
    N.NVML_VALUE_TYPE_DOUBLE: struct.Struct("@d").unpack_from,
    N.NVML_VALUE_TYPE_UNSIGNED_INT: struct.Struct("@I").unpack_from,
    N.NVML_VALUE_TYPE_UNSIGNED_LONG: struct.Struct("@L").unpack_from,
    N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: struct.Struct("@Q").unpack_from,
    N.NVML_VALUE_TYPE_SIGNED_LONG_LONG: struct.Struct("@q").unpack_from,
    N.NVML_VALUE_TYPE_SIGNED_INT: struct.Struct("@i").unpack_from,
    N.NVML_VALUE_TYPE_UNSIGNED_SHORT: struct.Struct("@H").unpack_from,
}
FieldId = int | tuple[int, int]  # a field id, or (field id, scope id)


class FieldValues:
    """The C array of one request: ``call(handle)`` yields (nvmlReturn, value or None) per id, in request order."""

    __slots__ = ("_buf", "_n")

    def __init__(self, ids: Sequence[FieldId]) -> None:
        self._n = len(ids)
        self._buf = ctypes.create_string_buffer(max(1, self._n) * _RESULT.size)
        for i, fid in enumerate(ids):
            field, scope = fid if isinstance(fid, tuple) else (fid, 0)
            _IDS.pack_into(self._buf, i * _RESULT.size, field, scope)

    def call(self, handle: Any) -> Iterator[tuple[int, int | float | None]]:
        """Raises NVMLError when the call as a whole fails; a value's own failure is its nvmlReturn."""
        fn = N._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        ret = fn(handle, ctypes.c_int32(self._n), self._buf)
        if ret != N.NVML_SUCCESS:
            raise N.NVMLError(ret)
        raw = ctypes.string_at(self._buf, self._n * _RESULT.size)
        for vtype, code, value in _RESULT.iter_unpack(raw):
            decode = _DECODE.get(vtype) if code == N.NVML_SUCCESS else None
            yield code, None if decode is None else decode(value)[0]
