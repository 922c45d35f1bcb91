"""A fake ``sys/bus/thunderbolt`` tree, and the PCI topology that ties a simulated dock to the GPUs behind it.

The state's ``thunderbolt`` key (Python-only; the stand-in C ignores it, docs/sim-state.md) lists the attached
Thunderbolt/USB4 devices. ``gpuwatchd sim`` mirrors it under ``sysfs.root`` as a real kernel lays it out, so the
daemon's Thunderbolt source (``gpuwatchd/sources/sysfs/thunderbolt.py``) reads it unchanged:

    sys/devices/pci0000:00/0000:00:0d.2/domain0/{security, 0-0/, 0-0/0-1/{authorized, unique_id, ...}}
    sys/devices/pci0000:00/0000:00:07.N/<enclosure bridge, removable>/<GPU, removable>   (docked GPU)
    sys/devices/pci0000:00/0000:00:01.0/<GPU>                                              (internal GPU)
    sys/bus/thunderbolt/devices/{domain0, 0-0, 0-1} -> ../../../devices/...
"""

from __future__ import annotations

import copy
from typing import Any

# The host controller's NHI and the root ports of its PCIe tunnels sit on the same root bus, as on Intel hosts
# with integrated Thunderbolt 4 (Tiger Lake and later: NHI 00:0d.2, tunnel root ports 00:07.0-3).
ROOT_BUS = "pci0000:00"
NHI = "0000:00:0d.2"
INTERNAL_PORT = "0000:00:01.0"
HOST_ROUTER_UNIQUE_ID = "d0a80000-7c53-4fbe-9a1e-000000000000"

DEVICE_KEYS = {
    "route", "unique_id", "vendor_name", "device_name", "authorized", "generation",
    "rx_speed", "tx_speed", "rx_lanes", "tx_lanes", "gpus",
}
_REQUIRED = ("route", "unique_id")
SECURITY_LEVELS = ("none", "user", "secure", "dponly", "usbonly")


def default_device(route: str = "0-1") -> dict[str, Any]:
    """A Thunderbolt 3 eGPU enclosure, authorized, trained at 2 lanes x 20 Gb/s."""
    return {
        "route": route, "unique_id": "", "vendor_name": "Razer", "device_name": "Core X", "authorized": 1,
        "generation": 3, "rx_speed": 20, "tx_speed": 20, "rx_lanes": 2, "tx_lanes": 2, "gpus": [],
    }


def validate(tb: object) -> None:
    """Check the state's ``thunderbolt`` value; ValueError names the key path."""
    if not isinstance(tb, dict) or set(tb) - {"security", "devices"}:
        raise ValueError("thunderbolt: expected a mapping with 'security' and 'devices'")
    sec = tb.get("security", "user")
    if sec not in SECURITY_LEVELS:
        raise ValueError(f"thunderbolt.security: {sec!r} is not one of {', '.join(SECURITY_LEVELS)}")
    devices = tb.get("devices") or []
    if not isinstance(devices, list):
        raise ValueError("thunderbolt.devices: expected a list")
    routes: set[str] = set()
    for i, d in enumerate(devices):
        p = f"thunderbolt.devices[{i}]"
        if not isinstance(d, dict):
            raise ValueError(f"{p}: expected a mapping")
        unknown = set(d) - DEVICE_KEYS
        if unknown:
            raise ValueError(f"{p}: unknown key(s) {', '.join(sorted(unknown))}")
        for k in _REQUIRED:
            if not isinstance(d.get(k), str) or not d[k]:
                raise ValueError(f"{p}.{k}: required string")
        dom, _, rest = d["route"].partition("-")
        if not dom.isdigit() or not rest or rest == "0" or any(c not in "0123456789abcdef" for c in rest):
            raise ValueError(f"{p}.route: expected '<domain>-<route>' like '0-1' (route 0 is the host router)")
        if d["route"] in routes:
            raise ValueError(f"{p}.route: duplicate {d['route']}")
        routes.add(d["route"])
        gpus = d.get("gpus", [])
        if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
            raise ValueError(f"{p}.gpus: expected a list of GPU uuids")


def hide_untunnelled(state: dict[str, Any]) -> dict[str, Any]:
    """The state without the GPUs behind an unauthorized dock: no PCIe tunnel, so the driver never sees them."""
    tb = state.get("thunderbolt")
    if not tb:
        return state
    hidden = {g for d in tb.get("devices") or [] if not d.get("authorized", 1) for g in d.get("gpus") or []}
    if not hidden:
        return state
    out = copy.copy(state)
    out["devices"] = [d for d in state.get("devices", []) if d.get("uuid") not in hidden]
    return out


def _bdf(dev: dict[str, Any]) -> str:
    pci = dev.get("pci") or {}
    return f"{pci.get('domain', 0):04x}:{pci.get('bus', 0):02x}:{pci.get('device', 0):02x}.0"


def gpu_parents(state: dict[str, Any]) -> dict[str, list[tuple[str, bool]]]:
    """Each GPU's PCI ancestors below the root bus, as (bus id, removable), keyed by the GPU's bus id.

    A GPU behind an authorized dock hangs off that dock's tunnel root port (``00:07.N``) through the enclosure's
    bridge (removable, on the bus just below the GPU's); every other GPU off an internal root port.
    """
    docked: dict[str, str] = {}
    for i, d in enumerate((state.get("thunderbolt") or {}).get("devices") or []):
        if d.get("authorized", 1):
            for g in d.get("gpus") or []:
                docked[g] = f"0000:00:07.{i % 8}"
    out: dict[str, list[tuple[str, bool]]] = {}
    for dev in state.get("devices", []):
        bdf = _bdf(dev)
        port = docked.get(dev.get("uuid", ""))
        if port is None:
            out[bdf] = [(INTERNAL_PORT, False)]
        else:
            bus = int(bdf[5:7], 16)
            bridge = f"0000:{(bus - 1) % 256:02x}:00.0"
            out[bdf] = [(port, False), (bridge, True)]
    return out


def tb_files(state: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Directory (relative to ``sys/devices``) -> its attribute files, for the domains and routers."""
    tb = state.get("thunderbolt")
    if not tb:
        return {}
    out: dict[str, dict[str, str]] = {}
    domains = sorted({d["route"].partition("-")[0] for d in tb.get("devices") or []} | {"0"})
    for dom in domains:
        base = f"{ROOT_BUS}/{NHI}/domain{dom}"
        out[base] = {"security": tb.get("security", "user")}
        out[f"{base}/{dom}-0"] = {
            "authorized": "1", "unique_id": HOST_ROUTER_UNIQUE_ID, "vendor_name": "Intel",
            "device_name": "Host router", "generation": "4",
        }
    for d in tb.get("devices") or []:
        dom = d["route"].partition("-")[0]
        files = {
            "authorized": str(int(bool(d.get("authorized", 1)))),
            "unique_id": d["unique_id"],
            "vendor_name": d.get("vendor_name") or "",
            "device_name": d.get("device_name") or "",
            "generation": str(d.get("generation") or ""),
        }
        for k in ("rx_speed", "tx_speed"):
            if d.get(k) is not None:
                files[k] = f"{float(d[k]):.1f} Gb/s"
        for k in ("rx_lanes", "tx_lanes"):
            if d.get(k) is not None:
                files[k] = str(int(d[k]))
        out[f"{ROOT_BUS}/{NHI}/domain{dom}/{dom}-0/{d['route']}"] = files
    return out
