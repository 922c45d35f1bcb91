"""A fake ``sys/bus/pci/devices`` tree that follows the simulated GPUs (``sysfs.root`` of a simulated daemon).

The daemon's hot-plug watch and PCIe link reader look at sysfs independently of NVML; ``gpuwatchd sim`` keeps this
tree in step with the stand-in state, so an unplug reaches the daemon the way it does on a real host.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

# sysfs current_link_speed text per PCIe generation (drivers/pci/pci-sysfs.c, PCIE_SPEED2STR).
_LINK_SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe",
               6: "64.0 GT/s PCIe"}


def sysfs_files(state: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The ``sys/bus/pci/devices/<bdf>`` files a host with the state's GPUs would show.

    A device removed from the state has no directory (Thunderbolt detach); a lost one keeps its directory, but its
    link reads dead (speed "Unknown", width 63), as a GPU that fell off the bus does (nvml-egpu.md section 3.3).
    """
    out: dict[str, dict[str, str]] = {}
    for dev in state.get("devices", []):
        pci, link = dev.get("pci") or {}, dev.get("pcie") or {}
        bdf = f"{pci.get('domain', 0):04x}:{pci.get('bus', 0):02x}:{pci.get('device', 0):02x}.0"
        dead = bool(dev.get("lost"))
        out[bdf] = {
            "vendor": "0x10de",
            "device": f"0x{(int(pci.get('pci_device_id') or 0) >> 16) & 0xFFFF:04x}",
            "class": "0x030000",
            "current_link_speed": "Unknown" if dead else _LINK_SPEED.get(link.get("gen") or 0, "Unknown"),
            "current_link_width": "63" if dead else str(link.get("width") or 0),
            "max_link_speed": _LINK_SPEED.get(link.get("max_gen") or 0, "Unknown"),
            "max_link_width": str(link.get("max_width") or 0),
        }
    return out


def mirror_sysfs(root: Path, state: dict[str, Any]) -> None:
    """Make ``root/sys/bus/pci/devices`` match the state, touching only what changed (the daemon's hot-plug watch
    reads this tree, so a device directory vanishing is how an unplug reaches it)."""
    base = root / "sys" / "bus" / "pci" / "devices"
    base.mkdir(parents=True, exist_ok=True)
    want = sysfs_files(state)
    for name in os.listdir(base):
        if name not in want:
            shutil.rmtree(base / name)
    for bdf, files in want.items():
        d = base / bdf
        d.mkdir(exist_ok=True)
        for fname, text in files.items():
            f = d / fname
            if not f.exists() or f.read_text(encoding="ascii") != text + "\n":
                f.write_text(text + "\n", encoding="ascii")
