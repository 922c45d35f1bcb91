"""MIG devices in scenarios: the fields of ``devices[N].mig_devices[M]`` (docs/scenarios.md) and their memory.

A scenario writes a MIG device like the stand-in state does (sim/state_mig.py); timeline paths reach into it,
e.g. ``devices[0].mig_devices[1].processes.compute[pid=4343].used_memory``. As for a GPU, a MIG device's
``memory.used`` in a scenario counts what no listed process owns; its processes add to it, and the GPU's used
memory is its own plus its MIG devices' (the aggregate a driver reports for a GPU in MIG mode).
"""

from __future__ import annotations

from typing import Any

# One MIG device's fields and their value types, in the shape check_field walks (sim/scenario_fields.py).
MIG_SCHEMA: dict[str, Any] = {
    "index": 0,
    "uuid": "",
    "profile": "",
    "gpu_instance_id": 0,
    "compute_instance_id": 0,
    "memory": {"total": 0, "reserved": 0, "used": 0},
    "processes": {"compute": [], "graphics": []},
    "errors": {},
}


def derive_mig_memory(dev: dict[str, Any]) -> None:
    """Each MIG device's used memory from its processes; adds them to the GPU's (before the GPU's own is derived)."""
    total_used = 0
    for m in dev.get("mig_devices") or ():
        mem = m.get("memory")
        if not isinstance(mem, dict):
            continue
        procs = m.get("processes") or {}
        owned = sum(int(p["used_memory"]) for kind in ("compute", "graphics") for p in procs.get(kind) or ()
                    if p.get("used_memory"))
        ceiling = int(mem.get("total") or 0) - int(mem.get("reserved") or 0)
        used = int(mem.get("used") or 0) + owned
        mem["used"] = max(0, min(used, ceiling)) if ceiling > 0 else used
        total_used += mem["used"]
    if total_used and dev.get("_other_used") is not None:
        dev["_other_used"] = int(dev["_other_used"]) + total_used
