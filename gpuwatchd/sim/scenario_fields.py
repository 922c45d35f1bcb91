"""Field paths and values of scenario files, checked against the stand-in's device schema.

``devices[0].memory.used``, ``devices[*].temperature``, ``devices[1].processes.compute[pid=4242].used_memory``,
``devices[1].delays_ms.*``, ``init_error``: see ``docs/scenarios.md``. Sizes may be written ``22GiB``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ValidationError

from gpuwatchd.config.types import format_loc

# ASCII digits (\d and float() take any script's), at most 30 of them: a size beyond 2**64 bytes is no GPU's.
_SIZE = re.compile(r"^\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\s*$", re.ASCII)
_SIZE_UNIT = {
    "B": 1,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}


def parse_quantity(value: Any) -> Any:
    """``"22GiB"`` / ``"1.5 GB"`` -> bytes as int; other values pass through unchanged."""
    if isinstance(value, str):
        m = _SIZE.match(value) if len(value) <= 80 else None
        if m:
            number = float(m.group(1)) * _SIZE_UNIT[m.group(2)]
            return int(number) if math.isfinite(number) else value  # 1e30 TiB: left as text, refused by its field
    return value


def _number(value: Any) -> Any:
    value = parse_quantity(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number or a size like 4GiB, got {value!r}")
    if not math.isfinite(value):
        raise ValueError("expected a finite number")
    return value


Number = Annotated[float, BeforeValidator(_number)]


# --- dotted paths ------------------------------------------------------------------------------------------------

_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\d+|\*|pid=\d+)\]|(\.)")

Segment = str | int | tuple[str, int]  # key, list index, ("pid", n) selector into a process list


@dataclass(frozen=True)
class FieldPath:
    """A parsed dotted path: ``devices[0].memory.used`` -> slot 0, keys ("memory", "used")."""

    text: str
    slot: int | Literal["*"] | None  # None: a top-level state key
    keys: tuple[Segment, ...]

    @property
    def leaf(self) -> str:
        last = [k for k in self.keys if isinstance(k, str)]
        return last[-1] if last else ""


def parse_path(text: str) -> FieldPath:
    """Parse a dotted path; raises ``ValueError`` naming what is wrong."""
    segments: list[Segment] = []
    pos = 0
    expect_key = True
    while pos < len(text):
        m = _SEGMENT.match(text, pos)
        if not m:
            raise ValueError(f"cannot parse field path {text!r} at {text[pos:]!r}")
        key, index, dot = m.groups()
        if dot:
            expect_key = True
        elif key is not None:
            if not expect_key:
                raise ValueError(f"cannot parse field path {text!r}: missing '.' before {key!r}")
            segments.append(key)
            expect_key = False
        elif index == "*":
            segments.append("*")
        elif index.startswith("pid="):
            segments.append(("pid", int(index[4:])))
        else:
            segments.append(int(index))
        pos = m.end()
    if not segments or not isinstance(segments[0], str):
        raise ValueError(f"empty or malformed field path {text!r}")
    if segments[0] == "thunderbolt":  # the fake Thunderbolt tree: thunderbolt.devices[0].authorized
        return FieldPath(text, None, tuple(segments))
    if segments[0] != "devices":
        if len(segments) != 1:
            raise ValueError(f"unknown field {text!r}")
        return FieldPath(text, None, (segments[0],))
    if len(segments) < 3 or not (isinstance(segments[1], int) or segments[1] == "*"):
        raise ValueError(f"a device field needs devices[N] or devices[*] and a field name, got {text!r}")
    slot: int | Literal["*"] = segments[1] if isinstance(segments[1], int) else "*"
    return FieldPath(text, slot, tuple(segments[2:]))


def device_schema() -> dict[str, Any]:
    from gpuwatchd.sim.state import make_device

    schema = make_device(0)
    # Keys the defaults may leave out, from docs/sim-state.md: open maps and flags the scenario may set.
    schema.setdefault("lost", False)
    schema.setdefault("errors", {})
    schema.setdefault("delays_ms", {})
    schema.setdefault("processes", {"compute": [], "graphics": []})
    schema.setdefault("supported_event_types", 0)
    from gpuwatchd.sim.standin_abi import READING_KEYS

    for key in READING_KEYS:  # the simple readings (sim/standin_readings.def): integers
        schema.setdefault(key, 0)
    schema.setdefault("mig_max_devices", 0)  # MIG devices: sim/scenario_mig.py
    schema.setdefault("mig_devices", [])
    if schema.get("nvlink_counters") is None:  # per link: devices[N].nvlink_counters[L].crc_flit
        from gpuwatchd.sim.state import NVLINK_COUNTER_KEYS

        schema["nvlink_counters"] = [dict.fromkeys(NVLINK_COUNTER_KEYS, 0)]
    from gpuwatchd.sim.state import FIELD_VALUE_KEYS

    if schema.get("field_values") is None:  # devices[N].field_values.pcie_bad_tlp
        schema["field_values"] = dict.fromkeys(FIELD_VALUE_KEYS, 0)
    schema.setdefault("pcie_lane_errors", [0])  # devices[N].pcie_lane_errors[L]
    schema.setdefault("temperature_margin", 0)
    schema.setdefault("cuda_compute_capability", [0, 0])  # [major, minor]: unset (NOT_SUPPORTED) by default
    from gpuwatchd.sim.state_fabric import FABRIC_KEYS, P2P_CAPS

    if schema.get("fabric") is None:  # devices[N].fabric.state (sim/state_fabric.py)
        schema["fabric"] = {**dict.fromkeys(FABRIC_KEYS, 0), "status": "SUCCESS", "cluster_uuid": "0" * 32}
    if schema.get("p2p") is None:  # devices[N].p2p.*.nvlink: every peer's
        schema["p2p"] = {"*": dict.fromkeys(P2P_CAPS, 0)}
    if schema.get("recovery_action") is None:
        schema["recovery_action"] = 0
    from gpuwatchd.sim.gpm_state import gpm_schema

    schema.setdefault("gpm", gpm_schema())
    return schema


_TOP_LEVEL = {"driver_version": str, "nvml_version": str, "cuda_driver_version": int, "init_error": str,
              "kernel_module_version": str, "torch": dict,  # the last two: sim/host_tree.py
              "host_pid_namespace": bool}  # sim/resolver.py
OPEN_MAPS = {"errors": str, "delays_ms": int}  # keyed by C symbol name or "*"
_PROCESS_FIELDS: dict[str, Any] = {"pid": int, "used_memory": int, "name": str, "user": str, "host_rss": int,
                                   "cgroup": str,  # cgroup: sim/host_tree.py writes it as proc/<pid>/cgroup
                                   "host_state": str}  # host_state: live|zombie|gone (sim/state.py)
_PROCESS_FIELDS.update({"sm_util": int, "memory_util": int, "encoder_util": int, "decoder_util": int})  # procutil.py


def _check_type(expected: Any, value: Any, what: str) -> None:
    if value is None or expected is None:
        return  # null = NOT_SUPPORTED for any reading; a None default takes anything
    if expected is bool:
        ok = isinstance(value, bool)
    elif expected in (int, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        ok = isinstance(value, expected)
    if not ok:
        raise ValueError(f"{what}: expected {expected.__name__}, got {value!r}")


def _type_of(default: Any) -> Any:
    return None if default is None else type(default)


def check_field(path: FieldPath, value: Any, schema: dict[str, Any], *, numeric: bool = False) -> Any:
    """Validate ``path`` (and ``value``) against the stand-in's device schema; returns the normalised value."""
    value = parse_quantity(value)
    keys = path.keys
    expected: Any
    if path.slot is None and keys[0] == "thunderbolt":
        return _check_thunderbolt(path, value)
    if path.slot is None:
        if keys[0] not in _TOP_LEVEL:
            raise ValueError(f"unknown field {path.text!r}")
        expected = _TOP_LEVEL[str(keys[0])]
    elif keys[0] == "mig_devices" and len(keys) > 2 and isinstance(keys[1], int):
        from gpuwatchd.sim.scenario_mig import MIG_SCHEMA  # devices[N].mig_devices[M].<a MIG device's field>

        return check_field(FieldPath(path.text, path.slot, keys[2:]), value, MIG_SCHEMA, numeric=numeric)
    elif keys[0] == PROBE_FAULTS:
        return _check_probe_faults(path, value)
    elif keys[0] in OPEN_MAPS:
        kind = OPEN_MAPS[str(keys[0])]
        if len(keys) == 1:
            if not isinstance(value, dict):
                raise ValueError(f"{path.text}: expected a mapping of NVML call name -> value")
            for sym, v in value.items():
                _check_symbol(str(sym), path.text)
                _check_type(kind, v, f"{path.text}.{sym}")
            return value
        if len(keys) != 2 or not isinstance(keys[1], str):
            raise ValueError(f"unknown field {path.text!r}")
        _check_symbol(keys[1], path.text)
        expected = kind
    elif keys[0] == "processes":
        if len(keys) > 1 and keys[1] not in ("compute", "graphics"):
            raise ValueError(f"unknown field {path.text!r}")
        if len(keys) == 4 and not isinstance(keys[2], str) and keys[3] in _PROCESS_FIELDS:
            expected = _PROCESS_FIELDS[str(keys[3])]
        elif len(keys) == 3 and not isinstance(keys[2], str):
            expected = dict
        elif len(keys) <= 2:
            expected = list if len(keys) == 2 else dict
        else:
            raise ValueError(f"unknown field {path.text!r}")
    else:
        node: Any = schema
        for k in keys:
            if isinstance(node, dict) and isinstance(k, str) and k in node:
                node = node[k]
            elif isinstance(node, list) and isinstance(k, int):
                node = node[0] if node else None
            elif isinstance(k, tuple):
                raise ValueError(f"{path.text}: [pid=N] selects a process in processes.compute/graphics only")
            else:
                raise ValueError(f"unknown field {path.text!r}")
        expected = _type_of(node)
    if numeric:
        if expected not in (int, float, None):
            raise ValueError(f"{path.text}: not a numeric field")
        return value
    _check_type(expected, value, path.text)
    return value


PROBE_FAULTS = "_probe"  # devices[N]._probe: probe faults for the sim (gpuwatchd.probes.faults); C ignores "_" keys


def _check_probe_faults(path: FieldPath, value: Any) -> Any:
    """``devices[N]._probe`` (a mapping) or ``devices[N]._probe.<fault>``."""
    from gpuwatchd.probes.faults import faults_from_dict

    keys = path.keys
    if len(keys) > 2 or (len(keys) == 2 and not isinstance(keys[1], str)):
        raise ValueError(f"unknown field {path.text!r}")
    try:
        faults_from_dict(value if len(keys) == 1 else {keys[1]: value})
    except ValueError as e:
        raise ValueError(f"{path.text}: {e}") from None
    return value


def _check_symbol(sym: str, where: str) -> None:
    if sym != "*" and not re.fullmatch(r"nvml[A-Za-z0-9_]+", sym):
        raise ValueError(f"{where}: {sym!r} is not an NVML call name (nvmlDevice...) or '*'")


# Value types of a simulated Thunderbolt device's fields (gpuwatchd/sim/tb_tree.py, docs/sim-state.md).
_TB_DEVICE_FIELDS: dict[str, Any] = {
    "route": str, "unique_id": str, "vendor_name": str, "device_name": str, "authorized": int, "generation": int,
    "rx_speed": float, "tx_speed": float, "rx_lanes": int, "tx_lanes": int, "gpus": list,
}


def _check_thunderbolt(path: FieldPath, value: Any) -> Any:
    """``thunderbolt`` (the whole mapping), ``thunderbolt.security`` or ``thunderbolt.devices[N].<field>``."""
    from gpuwatchd.sim.tb_tree import validate

    keys = path.keys
    if len(keys) == 1:
        validate(value)
        return value
    if keys[1] == "security" and len(keys) == 2:
        validate({"security": value})
        return value
    if keys[1] == "devices" and len(keys) == 4 and isinstance(keys[2], int) and keys[3] in _TB_DEVICE_FIELDS:
        _check_type(_TB_DEVICE_FIELDS[str(keys[3])], value, path.text)
        return value
    raise ValueError(f"unknown field {path.text!r}")


def format_validation_error(err: ValidationError) -> list[str]:
    """One ``key.path: message`` line per problem of a scenario file (pydantic; the daemon's config is msgspec)."""
    lines = []
    for e in err.errors(include_url=False):
        # pydantic puts validator names (e.g. "function-after[...]") into loc for unions; drop those parts.
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and "[" in p))
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{format_loc(loc)}: {msg}")
    return lines
