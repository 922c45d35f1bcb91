"""MIG devices in the stand-in's state: a GPU's ``mig_devices`` list (docs/sim-state.md), encoded as
``mig_device <index> <gpu instance id> <compute instance id>`` ... ``end_mig_device`` blocks inside its device block,
which ``standin_mig.c`` serves through MIG device handles.

A MIG device answers ``nvmlDeviceGetName`` with ``"<GPU name> MIG <profile>"``, as real drivers name MIG devices
(``NVIDIA A100-SXM4-80GB MIG 1g.10gb``); the daemon takes the profile from that name
(:mod:`gpuwatchd.sources.nvml.worker.mig`).
"""

from __future__ import annotations

import re
from typing import Any

from gpuwatchd.sim.standin_abi import ERROR_CODES, OVERRIDABLE_SYMBOLS
from gpuwatchd.sim.state_encode import (
    _STR_MAX,
    _U32,
    _dict,
    _Enc,
    _encode_memory,
    _encode_processes,
    _error_code,
    _fail,
    _int,
    _list,
    _str,
)

# standin_mig.c MAX_MIG: MIG device slots one GPU may have (7 on A100/H100, one per GPU-instance slice).
MAX_MIG_DEVICES = 16
# What nvmlDeviceGetMaxMigDeviceCount answers on an A100/H100 in MIG mode when the state does not say.
DEFAULT_MIG_MAX_DEVICES = 7
MIG_DEVICE_KEYS = {"index", "uuid", "profile", "gpu_instance_id", "compute_instance_id", "memory", "processes",
                   "errors"}
# "1g.10gb", "3g.40gb", "1g.10gb+me", "2c.3g.20gb" (compute-instance split): the profile names nvidia-smi shows.
_PROFILE = re.compile(r"^[0-9][0-9a-z.+]*$")

__all__ = ["DEFAULT_MIG_MAX_DEVICES", "ERROR_CODES", "MAX_MIG_DEVICES", "MIG_DEVICE_KEYS", "encode_mig_devices",
           "mig_name"]


def mig_name(gpu_name: str, profile: str | None) -> str:
    """The name a driver gives a MIG device: ``NVIDIA A100-SXM4-80GB MIG 1g.10gb`` (a replayed capture's MIG device
    of unknown profile: ``NVIDIA A100-SXM4-80GB MIG``)."""
    return f"{gpu_name} MIG" if profile is None else f"{gpu_name} MIG {profile}"


def encode_mig_devices(e: _Enc, p: str, d: dict[str, Any]) -> None:
    """The ``mig_max`` line and one block per MIG device of the GPU ``d`` (at path ``p``)."""
    migs = _list(f"{p}.mig_devices", d.get("mig_devices") or [])
    mode = d.get("mig_mode")
    if migs and (not isinstance(mode, list | tuple) or not mode or mode[0] != 1):
        raise _fail(f"{p}.mig_devices", "MIG devices need MIG mode on (mig_mode: [1, 1])")
    max_devices = _int(f"{p}.mig_max_devices", d.get("mig_max_devices", DEFAULT_MIG_MAX_DEVICES), 0, MAX_MIG_DEVICES)
    e.put("mig_max", max_devices)
    seen_index: dict[int, int] = {}
    seen_ids: dict[tuple[int, int], int] = {}
    for i, m in enumerate(migs):
        q = f"{p}.mig_devices[{i}]"
        _dict(q, m, MIG_DEVICE_KEYS, required=("uuid", "gpu_instance_id"))
        index = _int(f"{q}.index", m.get("index", i), 0, MAX_MIG_DEVICES - 1)
        assert index is not None and max_devices is not None
        if index >= max_devices:
            raise _fail(f"{q}.index", f"{index} is not below mig_max_devices ({max_devices})")
        if index in seen_index:
            raise _fail(f"{q}.index", f"duplicate of {p}.mig_devices[{seen_index[index]}].index ({index})")
        seen_index[index] = i
        gi = _int(f"{q}.gpu_instance_id", m["gpu_instance_id"], 0, _U32 - 1)
        ci = _int(f"{q}.compute_instance_id", m.get("compute_instance_id", 0), 0, _U32 - 1)
        assert gi is not None and ci is not None
        if (gi, ci) in seen_ids:
            raise _fail(q, f"same gpu/compute instance ids as {p}.mig_devices[{seen_ids[gi, ci]}]")
        seen_ids[gi, ci] = i
        uuid = _str(f"{q}.uuid", m["uuid"], _STR_MAX["uuid"])
        if not uuid.startswith("MIG-") or " " in uuid:
            raise _fail(f"{q}.uuid", "expected MIG-... without spaces (drivers name MIG devices MIG-<uuid>)")
        profile = None if m.get("profile") is None else _str(f"{q}.profile", m["profile"], 40)
        if profile is not None and not _PROFILE.match(profile):
            raise _fail(f"{q}.profile", f"expected a MIG profile name like 1g.10gb, got {profile!r}")
        e.put("mig_device", index, gi, ci)
        e.put("uuid", uuid)
        e.put("name", _str(f"{q}.profile", mig_name(str(d["name"]), profile), _STR_MAX["name"]))
        _encode_memory(e, q, m)
        _encode_processes(e, q, m)
        for sym, val in _dict(f"{q}.errors", m.get("errors") or {}, OVERRIDABLE_SYMBOLS | {"*"}).items():
            e.put("error", sym, _error_code(f"{q}.errors.{sym}", val))
        e.put("end_mig_device")
