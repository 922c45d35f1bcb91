"""The stand-in driver's state file: validate a state dict, encode it, replace the file atomically, read it back.

The schema is ``docs/sim-state.md``. The file is a line format the C side (``standin.c``) parses with ``getline``
and ``strtoll``; one state per file::

    GWSIM 1                                   magic + format version (first line; anything else: file rejected)
    # json {...}                              the state dict as compact JSON, for read_state (C skips '#' lines)
    driver_version 535.161.08                 <key> <args>, single space separated; strings run to end of line
    cuda_driver_version 12020
    init_error 9                              NVML return codes are numeric
    clock 1700000000.0
    device                                    one block per device, in NVML index order
    uuid GPU-...
    pci 0 12 0 573116638 341053662            fixed-arity numeric lines; "-" marks one missing value
    memory 24146608128 333774848 1048576
    fans 30 31                                list lines: any number of values ("fans" alone = empty list)
    processes_compute 4242 1073741824 77 -    pid/used_memory pairs; "-" = NVML_VALUE_NOT_AVAILABLE
    error nvmlDeviceGetPowerUsage 999         per-call overrides: symbol (or *) and return code / delay in ms
    delay * -1
    end_device
    event 1 8 79 GPU-...                      seq, nvmlEventType bits, data, uuid
    END                                       last line; a file without it (truncated) is rejected

A key that is absent (or ``null`` in the dict) is simply not written, and the C side answers NOT_SUPPORTED for it.
Unknown keys are ignored by the C side (forward compatibility); the writer refuses unknown dict keys (typos),
except keys starting with ``_``, which are carried in the JSON copy only.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatchd.sim.standin_abi import (
    ERROR_CODES,
    EVENT_TYPES,
    MAX_DEVICES,
    OVERRIDABLE_SYMBOLS,
    READING_KEYS,
    STANDIN_SYMBOLS,
)
from gpuwatchd.sim.state_encode import (
    _I64,
    _STR_MAX,
    _U32,
    PROCESS_HOST_STATES,
    _dict,
    _Enc,
    _encode_memory,
    _encode_processes,
    _error_code,
    _fail,
    _flag,
    _int,
    _list,
    _str,
)
from gpuwatchd.sim.state_fabric import encode_fabric
from gpuwatchd.sim.state_mig import encode_mig_devices

__all__ = [
    "ERROR_CODES",
    "EVENT_TYPES",
    "OVERRIDABLE_SYMBOLS",
    "PROCESS_HOST_STATES",
    "RELOAD_CHECK_S",
    "STANDIN_SYMBOLS",
    "StateWriter",
    "bus_id",
    "encode_state",
    "make_device",
    "make_state",
    "read_state",
    "write_state",
]

MAGIC = "GWSIM 1"
# How often the stand-in may stat() the state file (standin.c RELOAD_CHECK_NS): a rewrite is seen within this.
RELOAD_CHECK_S = 0.002
_JSON_PREFIX = "# json "

_NVLINK_MAX_LINKS = 36  # nvml.h NVML_NVLINK_MAX_LINKS


_TOP_KEYS = {"clock", "driver_version", "nvml_version", "cuda_driver_version", "init_error", "devices", "events",
             "thunderbolt", "kernel_module_version", "torch", "host_pid_namespace"}
# thunderbolt, kernel_module_version, torch: Python-only, the rest of the simulated host (sim/tb_tree.py,
# sim/host_tree.py); the stand-in C never sees them. host_pid_namespace (Python-only, default true): whether the
# daemon's /proc is the host's pid namespace (sim/resolver.py); false models a daemon in a container without hostPID.
# A process' host_state (Python-only, default "live"): what /proc says of its pid: "live", "zombie", or "gone" (no
# /proc entry: the process exited but the driver still holds its memory; PROCESS_HOST_STATES, sim/state_encode.py).
_CLOCK_KEYS = ("graphics", "sm", "memory", "video")  # nvmlClockType_t order
_THRESHOLD_KEYS = ("shutdown", "slowdown", "mem_max", "gpu_max")  # nvmlTemperatureThresholds_t 0..3
_VIOLATION_KEYS = (
    "power",
    "thermal",
    "sync_boost",
    "board_limit",
    "low_utilization",
    "reliability",
    "total_app_clocks",
    "total_base_clocks",
)
_ECC_KEYS = ("corrected_volatile", "uncorrected_volatile", "corrected_aggregate", "uncorrected_aggregate")
# nvmlDeviceGetFieldValues ids the stand-in serves, in its order (standin.c FIELD_VALUES): NVML_FI_DEV_MEMORY_TEMP,
# _PCIE_REPLAY_ROLLOVER_COUNTER, _PCIE_COUNT_CORRECTABLE_ERRORS, _PCIE_COUNT_NON_FATAL_ERROR, _PCIE_COUNT_FATAL_ERROR,
# _PCIE_COUNT_NAKS_RECEIVED, _NAKS_SENT, _BAD_TLP, _BAD_DLLP, _LCRC_ERROR, _RECEIVER_ERROR, _UNSUPPORTED_REQ.
FIELD_VALUE_KEYS = ("memory_temp", "pcie_replay_rollover", "pcie_correctable_errors", "pcie_non_fatal_errors",
                     "pcie_fatal_errors", "pcie_naks_received", "pcie_naks_sent", "pcie_bad_tlp", "pcie_bad_dllp",
                     "pcie_lcrc_errors", "pcie_receiver_errors", "pcie_unsupported_requests")
# NVML_FI_DEV_PCIE_COUNT_LANE_ERROR is asked per lane (scopeId); standin.h PCIE_MAX_LANES
_PCIE_MAX_LANES = 16
_ENCODER_STATS_KEYS = ("session_count", "average_fps", "average_latency_us")
# One per-process utilization sample (standin_procutil.c), in its line order; the six percentages are
# nvmlProcessUtilizationInfo_v1_t's (nvml.h), the older nvmlProcessUtilizationSample_t has the first four.
PROCESS_UTILIZATION_KEYS = ("pid", "timestamp_us", "sm", "memory", "encoder", "decoder", "jpeg", "ofa")
# Per-link NVLink counters (standin_nvlink.c "nvlink_counters" line order): data KiB sent/received, CRC flit / CRC
# data / replay / recovery error counts.
NVLINK_COUNTER_KEYS = ("tx_kib", "rx_kib", "crc_flit", "crc_data", "replay", "recovery")
_PCIE_KEYS = ("gen", "max_gen", "gpu_max_gen", "width", "max_width", "tx_kbps", "rx_kbps", "replay_counter")


def _opt_fields(e: _Enc, path: str, d: dict[str, Any], key: str, *, names: tuple[str, ...], line: str, hi: int) -> None:
    v = d.get(key)
    if v is not None:
        v = _dict(f"{path}.{key}", v, names)
        e.put(line, *(_int(f"{path}.{key}.{n}", v.get(n), 0, hi, nullable=True) for n in names))


_DEVICE_KEYS = {
    "uuid",
    "name",
    "serial",
    "pci",
    "memory",
    "utilization",
    "temperature",
    "temperature_thresholds",
    "encoder_utilization",
    "decoder_utilization",
    "field_values",
    "pcie_lane_errors",
    "temperature_margin",
    "encoder_stats",
    "power_constraints_mw",
    "cuda_compute_capability",
    "clocks_mhz",
    "max_clocks_mhz",
    "violation_ns",
    "pstate",
    "fans",
    "ecc_mode",
    "ecc_errors",
    "retired_pages",
    "remapped_rows",
    "pcie",
    "nvlink",
    "nvlink_counters",
    "recovery_action",
    "fabric",  # GPU fabric and P2P status (sim/state_fabric.py)
    "p2p",
    "mig_mode",
    "supported_event_types",
    "processes",
    "process_utilization",
    "lost",
    "errors",
    "delays_ms",
    "gpm",
    "mig_max_devices",  # MIG (sim/state_mig.py)
    "mig_devices",
    *READING_KEYS,  # the simple readings (sim/standin_readings.def)
}


def _encode_overrides(e: _Enc, p: str, d: dict[str, Any]) -> None:
    for key, line in (("errors", "error"), ("delays_ms", "delay")):
        for sym, val in _dict(f"{p}.{key}", d.get(key) or {}, OVERRIDABLE_SYMBOLS | {"*"}).items():
            q = f"{p}.{key}.{sym}"
            e.put(line, sym, _error_code(q, val) if key == "errors" else _int(q, val, -1, 2**31 - 1))


def _encode_device(e: _Enc, p: str, d: dict[str, Any]) -> None:
    _dict(p, d, _DEVICE_KEYS, required=("uuid", "name"))
    e.put("device")
    uuid = _str(f"{p}.uuid", d["uuid"], _STR_MAX["uuid"])
    if not uuid or " " in uuid:
        raise _fail(f"{p}.uuid", "must be non-empty without spaces")
    e.put("uuid", uuid)
    e.put("name", _str(f"{p}.name", d["name"], _STR_MAX["name"]))
    if d.get("serial") is not None:
        e.put("serial", _str(f"{p}.serial", d["serial"], _STR_MAX["serial"]))
    for key, (lo, hi) in READING_KEYS.items():  # sim/standin_readings.def: the state key is the line
        if d.get(key) is not None:
            e.put(key, _int(f"{p}.{key}", d[key], lo, hi))
    for key, hi in (("temperature", 255), ("encoder_utilization", 100), ("decoder_utilization", 100)):
        if d.get(key) is not None:
            e.put(key, _int(f"{p}.{key}", d[key], 0, hi))
    if d.get("pstate") is not None:
        ps = _int(f"{p}.pstate", d["pstate"], 0, 32)
        if ps is not None and 15 < ps < 32:
            raise _fail(f"{p}.pstate", "expected 0..15 or 32 (unknown)")
        e.put("pstate", ps)
    if d.get("pci") is not None:
        pci = _dict(
            f"{p}.pci",
            d["pci"],
            {"domain", "bus", "device", "pci_device_id", "pci_subsystem_id"},
            required=("domain", "bus", "device"),
        )
        e.put(
            "pci",
            _int(f"{p}.pci.domain", pci["domain"], 0, _U32),
            _int(f"{p}.pci.bus", pci["bus"], 0, 255),
            _int(f"{p}.pci.device", pci["device"], 0, 31),
            _int(f"{p}.pci.pci_device_id", pci.get("pci_device_id", 0), 0, _U32),
            _int(f"{p}.pci.pci_subsystem_id", pci.get("pci_subsystem_id", 0), 0, _U32),
        )
    _encode_memory(e, p, d)
    if d.get("utilization") is not None:
        u = _dict(f"{p}.utilization", d["utilization"], {"gpu", "memory"}, required=("gpu", "memory"))
        e.put(
            "utilization",
            _int(f"{p}.utilization.gpu", u["gpu"], 0, 100),
            _int(f"{p}.utilization.memory", u["memory"], 0, 100),
        )
    _opt_fields(e, p, d, "temperature_thresholds", names=_THRESHOLD_KEYS, line="temperature_thresholds", hi=255)
    _opt_fields(e, p, d, "clocks_mhz", names=_CLOCK_KEYS, line="clocks", hi=_U32)
    _opt_fields(e, p, d, "max_clocks_mhz", names=_CLOCK_KEYS, line="max_clocks", hi=_U32)
    _opt_fields(e, p, d, "violation_ns", names=_VIOLATION_KEYS, line="violation", hi=_I64)
    _opt_fields(e, p, d, "ecc_errors", names=_ECC_KEYS, line="ecc_errors", hi=_I64)
    _opt_fields(e, p, d, "pcie", names=_PCIE_KEYS, line="pcie", hi=_U32)
    _opt_fields(e, p, d, "field_values", names=FIELD_VALUE_KEYS, line="field_values", hi=_I64)
    if d.get("encoder_stats") is not None:  # one call answers all three: all or nothing
        es = _dict(f"{p}.encoder_stats", d["encoder_stats"], set(_ENCODER_STATS_KEYS), required=_ENCODER_STATS_KEYS)
        e.put("encoder_stats", *(_int(f"{p}.encoder_stats.{k}", es[k], 0, _U32) for k in _ENCODER_STATS_KEYS))
    for key, line in (
        ("power_constraints_mw", "power_constraints"),
        ("cuda_compute_capability", "cuda_compute_capability"),
        ("ecc_mode", "ecc_mode"),
        ("mig_mode", "mig_mode"),
    ):
        if d.get(key) is not None:
            pair = _list(f"{p}.{key}", d[key])
            if len(pair) != 2:
                raise _fail(f"{p}.{key}", "expected [current, pending] / [min, max] / [major, minor]")
            e.put(line, *(_int(f"{p}.{key}[{i}]", x, 0, _U32) for i, x in enumerate(pair)))
    if d.get("temperature_margin") is not None:  # signed: a GPU past its slowdown threshold has a negative margin
        e.put("temperature_margin", _int(f"{p}.temperature_margin", d["temperature_margin"], -273, 255))
    for key, hi, cap in (("fans", 100, 64), ("nvlink", 1, _NVLINK_MAX_LINKS),
                         ("pcie_lane_errors", _I64, _PCIE_MAX_LANES)):
        if d.get(key) is not None:
            vals = _list(f"{p}.{key}", d[key])
            if len(vals) > cap:
                raise _fail(f"{p}.{key}", f"at most {cap} entries")
            e.put(key, *(_int(f"{p}.{key}[{i}]", x, 0, hi) for i, x in enumerate(vals)))
    _encode_nvlink_counters(e, p, d)
    encode_fabric(e, p, d)
    if d.get("recovery_action") is not None:
        e.put("recovery_action", _int(f"{p}.recovery_action", d["recovery_action"], 0, _U32))
    if d.get("retired_pages") is not None:
        rp = _dict(f"{p}.retired_pages", d["retired_pages"], {"sbe", "dbe", "pending"})
        e.put("retired_pending", _flag(f"{p}.retired_pages.pending", rp.get("pending", False)))
        for cause in ("sbe", "dbe"):
            pages = _list(f"{p}.retired_pages.{cause}", rp.get(cause, []))
            e.put(f"retired_{cause}", *(_int(f"{p}.retired_pages.{cause}[{i}]", a) for i, a in enumerate(pages)))
    if d.get("remapped_rows") is not None:
        rr = _dict(
            f"{p}.remapped_rows",
            d["remapped_rows"],
            {"correctable", "uncorrectable", "pending", "failure"},
            required=("correctable", "uncorrectable"),
        )
        e.put(
            "remapped_rows",
            _int(f"{p}.remapped_rows.correctable", rr["correctable"], 0, _U32),
            _int(f"{p}.remapped_rows.uncorrectable", rr["uncorrectable"], 0, _U32),
            _flag(f"{p}.remapped_rows.pending", rr.get("pending", False)),
            _flag(f"{p}.remapped_rows.failure", rr.get("failure", False)),
        )
    if "supported_event_types" in d:  # absent: C default (every event bit); null: NOT_SUPPORTED
        e.put("supported_event_types", _int(f"{p}.supported_event_types", d["supported_event_types"], nullable=True))
    _encode_processes(e, p, d)
    if d.get("process_utilization") is not None:  # absent/null: NOT_SUPPORTED; []: supported, no samples
        _encode_process_utilization(e, f"{p}.process_utilization", d["process_utilization"])
    if d.get("gpm") is not None:
        from gpuwatchd.sim.gpm_state import encode_gpm

        encode_gpm(e.put, f"{p}.gpm", d["gpm"])
    if d.get("lost") is not None:
        e.put("lost", _flag(f"{p}.lost", d["lost"]))
    _encode_overrides(e, p, d)
    if d.get("mig_devices") is not None or d.get("mig_max_devices") is not None:
        encode_mig_devices(e, p, d)
    e.put("end_device")


def _encode_process_utilization(e: _Enc, p: str, samples: object) -> None:
    args: list[object] = []
    for i, s in enumerate(_list(p, samples)):
        q = f"{p}[{i}]"
        _dict(q, s, set(PROCESS_UTILIZATION_KEYS), required=("pid", "timestamp_us"))
        args.append(_int(f"{q}.pid", s["pid"], 1, _U32))
        args.append(_int(f"{q}.timestamp_us", s["timestamp_us"], 1, _I64))
        args += [_int(f"{q}.{k}", s.get(k, 0), 0, 100) for k in PROCESS_UTILIZATION_KEYS[2:]]
    e.put("process_utilization", *args)


def _encode_nvlink_counters(e: _Enc, p: str, d: dict[str, Any]) -> None:
    """``nvlink_counters``: one object per link (null: that link has none), a line per link."""
    if d.get("nvlink_counters") is None:
        return
    links = _list(f"{p}.nvlink_counters", d["nvlink_counters"])
    if len(links) > _NVLINK_MAX_LINKS:
        raise _fail(f"{p}.nvlink_counters", f"at most {_NVLINK_MAX_LINKS} links")
    for link, raw in enumerate(links):
        if raw is None:
            continue
        q = f"{p}.nvlink_counters[{link}]"
        c = _dict(q, raw, NVLINK_COUNTER_KEYS)
        e.put("nvlink_counters", link, *(_int(f"{q}.{k}", c.get(k), 0, _I64, nullable=True)
                                         for k in NVLINK_COUNTER_KEYS))


def encode_state(state: dict[str, Any]) -> str:
    """Validate ``state`` (docs/sim-state.md) and return the file text; ValueError names the offending key path."""
    _dict("", state, _TOP_KEYS)
    e = _Enc()
    e.lines.append(MAGIC)
    e.lines.append(_JSON_PREFIX + json.dumps(state, separators=(",", ":"), sort_keys=True))
    for key in ("driver_version", "nvml_version"):
        if state.get(key) is not None:
            e.put(key, _str(key, state[key], _STR_MAX[key]))
    if state.get("cuda_driver_version") is not None:
        e.put("cuda_driver_version", _int("cuda_driver_version", state["cuda_driver_version"], 0, 2**31 - 1))
    if state.get("init_error") is not None:
        e.put("init_error", _error_code("init_error", state["init_error"]))
    if state.get("torch") is not None:
        from gpuwatchd.sim.host_tree import validate_torch

        validate_torch(state["torch"])
    if state.get("host_pid_namespace") is not None and not isinstance(state["host_pid_namespace"], bool):
        raise _fail("host_pid_namespace", f"expected true or false, got {state['host_pid_namespace']!r}")
    if state.get("thunderbolt") is not None:
        from gpuwatchd.sim.tb_tree import validate

        validate(state["thunderbolt"])
    if state.get("clock") is not None:
        c = state["clock"]
        if isinstance(c, bool) or not isinstance(c, int | float) or c < 0:
            raise _fail("clock", f"expected unix seconds, got {c!r}")
        e.put("clock", repr(float(c)))
    devices = _list("devices", state.get("devices") or [])
    if len(devices) > MAX_DEVICES:
        raise _fail("devices", f"at most {MAX_DEVICES} devices")
    seen: dict[str, int] = {}
    for i, dev in enumerate(devices):
        _encode_device(e, f"devices[{i}]", dev)
        if dev["uuid"] in seen:
            raise _fail(f"devices[{i}].uuid", f"duplicate of devices[{seen[dev['uuid']]}].uuid ({dev['uuid']})")
        seen[dev["uuid"]] = i
    last_seq = 0
    for i, ev in enumerate(_list("events", state.get("events") or [])):
        q = f"events[{i}]"
        _dict(q, ev, {"seq", "uuid", "type", "data"}, required=("seq", "uuid", "type"))
        seq = _int(f"{q}.seq", ev["seq"], 1)
        assert seq is not None
        if seq <= last_seq:
            raise _fail(f"{q}.seq", f"must strictly increase (previous {last_seq})")
        last_seq = seq
        if ev["type"] not in EVENT_TYPES:
            raise _fail(f"{q}.type", f"unknown event type {ev['type']!r} (known: {', '.join(EVENT_TYPES)})")
        uuid = _str(f"{q}.uuid", ev["uuid"], _STR_MAX["uuid"])
        e.put("event", seq, EVENT_TYPES[ev["type"]], _int(f"{q}.data", ev.get("data", 0)), uuid)
    e.lines.append("END")
    return "\n".join(e.lines) + "\n"


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Validate, encode and atomically replace ``path`` (temp file in the same directory, fsync, rename)."""
    text = encode_state(state)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# A state file the sim writes: 256 GPUs with a maximal process population each stays below 32 MiB.
MAX_STATE_BYTES = 64 << 20


def read_state(path: Path) -> dict[str, Any]:
    """The state dict that ``write_state`` wrote to ``path`` (ValueError if the file is not a state file)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return _decode_state(path, lines)


def read_state_file(path: Path) -> dict[str, Any]:
    """:func:`read_state` for a path a user named (``doctor --sim``): a regular file of at most
    :data:`MAX_STATE_BYTES`, read without blocking; every problem is a one-line ``ValueError``."""
    from gpuwatchd.config.files import InputFileError, read_text_file, shown_path

    try:
        text = read_text_file(path, max_bytes=MAX_STATE_BYTES)
    except InputFileError as e:
        raise ValueError(f"{shown_path(path)}: {e}") from None
    try:
        return _decode_state(Path(shown_path(path)), text.splitlines())
    except RecursionError:
        raise ValueError(f"{shown_path(path)}: JSON nested too deeply") from None


def _decode_state(path: Path, lines: list[str]) -> dict[str, Any]:
    if len(lines) < 2 or lines[0] != MAGIC or not lines[1].startswith(_JSON_PREFIX) or lines[-1] != "END":
        raise ValueError(f"{path}: not a complete stand-in state file (expected {MAGIC!r} ... 'END')")
    result = json.loads(lines[1][len(_JSON_PREFIX) :])
    if not isinstance(result, dict):
        raise ValueError(f"{path}: the state is not a JSON object")
    return result


def bus_id(pci: dict[str, Any], *, legacy: bool = False) -> str:
    """NVML's PCI bus id for a state ``pci`` dict: ``00000000:0C:00.0`` (legacy form ``0000:0C:00.0``)."""
    fmt = "{:04X}:{:02X}:{:02X}.0" if legacy else "{:08X}:{:02X}:{:02X}.0"
    return fmt.format(pci["domain"] & (0xFFFF if legacy else 0xFFFFFFFF), pci["bus"], pci["device"])


def make_device(index: int, **overrides: Any) -> dict[str, Any]:
    """A valid device dict with an idle AWS A10G's values (from a real ``nvidia-smi -q -x``); ``overrides`` replace."""
    dev: dict[str, Any] = {
        "uuid": f"GPU-5a3c1b2e-0000-4000-8000-{index:012x}",
        "name": "NVIDIA A10G",
        "serial": f"13243210{index:05d}",
        "minor_number": index,
        "pci": {
            "domain": index // 200,
            "bus": 0x0C + index % 200,
            "device": 0,
            "pci_device_id": 0x223710DE,
            "pci_subsystem_id": 0x152F10DE,
        },
        "memory": {"total": 24146608128, "reserved": 456130560, "used": 1048576},
        "utilization": {"gpu": 0, "memory": 0},
        "temperature": 31,
        "temperature_thresholds": {"shutdown": 98, "slowdown": 95, "mem_max": None, "gpu_max": 88},
        "power_usage_mw": 25000,
        "power_limit_mw": 300000,
        "power_constraints_mw": [100000, 300000],
        "persistence_mode": 1,
        "energy_mj": 123456789,
        "clocks_mhz": {"graphics": 210, "sm": 210, "memory": 405, "video": 555},
        "max_clocks_mhz": {"graphics": 1710, "sm": 1710, "memory": 6251, "video": 1500},
        "clocks_event_reasons": 1,
        "supported_clocks_event_reasons": 0x1FF,
        "violation_ns": dict.fromkeys(_VIOLATION_KEYS, 0),
        "pstate": 8,
        "fans": [0],
        "ecc_mode": [1, 1],
        "ecc_errors": dict.fromkeys(_ECC_KEYS, 0),
        "retired_pages": {"sbe": [], "dbe": [], "pending": False},
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "pcie": {
            "gen": 1,
            "max_gen": 4,
            "gpu_max_gen": 4,
            "width": 8,
            "max_width": 16,
            "tx_kbps": 0,
            "rx_kbps": 0,
            "replay_counter": 0,
        },
        "nvlink": None,
        "nvlink_counters": None,
        "recovery_action": None,
        "mig_mode": None,
        "processes": {"compute": [], "graphics": []},
        "lost": False,
    }
    dev.update(copy.deepcopy(overrides))
    return dev


def make_state(n_gpus: int, **overrides: Any) -> dict[str, Any]:
    """A valid state with ``n_gpus`` devices from ``make_device``; top-level keys in ``overrides`` replace."""
    state: dict[str, Any] = {
        "clock": 1700000000.0,
        "driver_version": "535.161.08",
        "nvml_version": "12.535.161.08",
        "cuda_driver_version": 12020,
        "init_error": None,
        "devices": [make_device(i) for i in range(n_gpus)],
        "events": [],
    }
    state.update(copy.deepcopy(overrides))
    return state


# What the ``write_sim_state`` test fixture returns: write a state, get the state file path back.
StateWriter = Callable[[dict[str, Any]], Path]
