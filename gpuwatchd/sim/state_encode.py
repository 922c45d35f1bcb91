"""The encoder's checks and the pieces of a device block both state writers use (:mod:`gpuwatchd.sim.state` for GPUs,
:mod:`gpuwatchd.sim.state_mig` for MIG devices): every check raises ValueError naming the key path."""

from __future__ import annotations

from typing import Any

from gpuwatchd.sim.standin_abi import ERROR_CODES

_U32 = 2**32 - 1
_I64 = 2**63 - 1
# nvml.h buffer sizes (UUID_V2 96, NAME_V2 96, SERIAL 30, driver/NVML version 80), including the NUL
_STR_MAX = {"uuid": 95, "name": 95, "serial": 29, "driver_version": 79, "nvml_version": 79}
PROCESS_HOST_STATES = ("live", "zombie", "gone")


class _Enc:
    """Collects encoded lines; every check raises ValueError naming the key path."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def put(self, key: str, *args: object) -> None:
        self.lines.append(" ".join([key, *("-" if a is None else str(a) for a in args)]))


def _fail(path: str, msg: str) -> ValueError:
    return ValueError(f"{path}: {msg}")


def _int(path: str, v: object, lo: int = 0, hi: int = _I64, *, nullable: bool = False) -> int | None:
    if v is None and nullable:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(path, f"expected an integer, got {v!r}")
    if not lo <= v <= hi:
        shown = str(v) if -(10**30) < v < 10**30 else f"an integer of {v.bit_length()} bits"
        raise _fail(path, f"{shown} is outside {lo}..{hi}")
    return v


def _flag(path: str, v: object) -> int:
    if isinstance(v, bool) or v in (0, 1):
        return int(bool(v))
    raise _fail(path, f"expected a boolean, got {v!r}")


def _str(path: str, v: object, max_len: int = 4000) -> str:
    if not isinstance(v, str):
        raise _fail(path, f"expected a string, got {v!r}")
    if any(c in v for c in "\n\r\0") or len(v.encode()) > max_len:
        raise _fail(path, f"must be one line of at most {max_len} bytes")
    return v


def _dict(
    path: str, v: object, keys: tuple[str, ...] | set[str] | frozenset[str], required: tuple[str, ...] = ()
) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _fail(path, f"expected an object, got {type(v).__name__}")
    for k in v:
        if k not in keys and not str(k).startswith("_"):
            raise _fail(f"{path}.{k}" if path else str(k), f"unknown key (known: {', '.join(sorted(keys))})")
    for k in required:
        if v.get(k) is None:
            raise _fail(f"{path}.{k}" if path else k, "required")
    return v


def _list(path: str, v: object) -> list[Any]:
    if not isinstance(v, list | tuple):
        raise _fail(path, f"expected a list, got {type(v).__name__}")
    return list(v)


def _error_code(path: str, v: object) -> int:
    if not isinstance(v, str) or v not in ERROR_CODES:
        raise _fail(path, f"unknown NVML error {v!r} (use NVML_ERROR_* names without the prefix, e.g. 'GPU_IS_LOST')")
    return ERROR_CODES[v]


def _encode_memory(e: _Enc, p: str, d: dict[str, Any]) -> None:
    if d.get("memory") is not None:
        m = _dict(f"{p}.memory", d["memory"], {"total", "reserved", "used"}, required=("total", "used"))
        total, used = _int(f"{p}.memory.total", m["total"]), _int(f"{p}.memory.used", m["used"])
        reserved = _int(f"{p}.memory.reserved", m.get("reserved", 0))
        assert total is not None and used is not None and reserved is not None
        if reserved + used > total:
            raise _fail(f"{p}.memory.used", f"reserved + used ({reserved + used}) exceeds total ({total})")
        e.put("memory", total, reserved, used)


def _encode_processes(e: _Enc, p: str, d: dict[str, Any]) -> None:
    if d.get("processes") is not None:
        procs = _dict(f"{p}.processes", d["processes"], {"compute", "graphics"})
        for kind in ("compute", "graphics"):
            if procs.get(kind) is None:
                continue
            args: list[object] = []
            for i, pr in enumerate(_list(f"{p}.processes.{kind}", procs[kind])):
                q = f"{p}.processes.{kind}[{i}]"
                _dict(q, pr, {"pid", "used_memory", "name", "user", "host_rss", "cgroup",
                           "host_state"}, required=("pid",))
                for k in ("name", "user", "cgroup"):
                    if pr.get(k) is not None:
                        _str(f"{q}.{k}", pr[k])
                if pr.get("host_state") is not None and pr["host_state"] not in PROCESS_HOST_STATES:
                    raise _fail(f"{q}.host_state", f"expected one of {', '.join(PROCESS_HOST_STATES)}, "
                                                   f"got {pr['host_state']!r}")
                _int(f"{q}.host_rss", pr.get("host_rss"), nullable=True)
                args += [
                    _int(f"{q}.pid", pr["pid"], 1, _U32),
                    _int(f"{q}.used_memory", pr.get("used_memory"), nullable=True),
                ]
            e.put(f"processes_{kind}", *args)
