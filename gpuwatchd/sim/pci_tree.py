"""A fake ``sys/bus/pci/devices`` tree that follows the simulated GPUs (``sysfs.root`` of a simulated daemon).

The daemon's hot-plug watch and PCIe link reader look at sysfs independently of NVML; ``gpuwatchd sim`` keeps this
tree in step with the stand-in state, so an unplug reaches the daemon the way it does on a real host.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from gpuwatchd.sim.host_tree import mirror_host
from gpuwatchd.sim.tb_tree import ROOT_BUS, gpu_parents, tb_files

# sysfs current_link_speed text per PCIe generation (drivers/pci/pci-sysfs.c, PCIE_SPEED2STR).
_LINK_SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe",
               6: "64.0 GT/s PCIe"}


def sysfs_files(state: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The ``sys/bus/pci/devices/<bdf>`` files a host with the state's GPUs would show.

    A device removed from the state has no directory (Thunderbolt detach); a lost one keeps its directory, but its
    link reads dead (speed "Unknown", width 63), as a GPU that fell off the bus does (its config space reads
    all-ones; see ``DEAD_LINK_WIDTH`` in ``gpuwatchd/sources/sysfs/pcie.py``).
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
            **aer_files(dev.get("field_values") or {}),
        }
    return out


# The kernel's AER stats files (drivers/pci/pcie/aer.c: one "Name count" line per error bit, then the total), from
# the NVML PCIe error fields of the state: what the GPU counts is what its AER capability reports.
_AER_CORRECTABLE = (("RxErr", "pcie_receiver_errors"), ("BadTLP", "pcie_bad_tlp"), ("BadDLLP", "pcie_bad_dllp"),
                    ("Rollover", None), ("Timeout", None), ("NonFatalErr", None), ("CorrIntErr", None),
                    ("HeaderOF", None))
_AER_UNCORRECTABLE = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
                      "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
                      "PoisonTLPBlocked")


def aer_files(fields: dict[str, Any]) -> dict[str, str]:
    """``aer_dev_correctable``, ``aer_dev_nonfatal`` and ``aer_dev_fatal`` for a GPU with these field values."""
    def n(key: str | None) -> int:
        v = fields.get(key) if key is not None else None
        return int(v) if isinstance(v, (int, float)) else 0

    cor = [(name, n(key)) for name, key in _AER_CORRECTABLE]
    total_cor = n("pcie_correctable_errors") or sum(c for _, c in cor)
    nonfatal, fatal = n("pcie_non_fatal_errors"), n("pcie_fatal_errors")
    # Uncorrectable errors are put on the data link protocol bit (a bad link's usual one); the total is the field.
    def uncorrectable(total: int, total_name: str) -> str:
        lines = [f"{name} {total if name == 'DLP' else 0}" for name in _AER_UNCORRECTABLE]
        return "\n".join([*lines, f"{total_name} {total}"]) + "\n"

    return {
        "aer_dev_correctable": "\n".join([*(f"{k} {v}" for k, v in cor), f"TOTAL_ERR_COR {total_cor}"]) + "\n",
        "aer_dev_nonfatal": uncorrectable(nonfatal, "TOTAL_ERR_NONFATAL"),
        "aer_dev_fatal": uncorrectable(fatal, "TOTAL_ERR_FATAL"),
    }


def mirror_sysfs(root: Path, state: dict[str, Any]) -> None:
    """Make ``root/sys`` match the state, touching only what changed (the daemon's hot-plug watch reads this tree,
    so a device directory vanishing is how an unplug reaches it).

    Laid out as the kernel does: device directories under ``sys/devices/pci0000:00/...`` (a docked GPU below its
    dock's tunnel port and enclosure bridge, ``sim/tb_tree.py``) and ``sys/bus/{pci,thunderbolt}/devices/<name>``
    symlinks to them. A device is written before its link appears and its link goes before its directory, so a
    concurrent scan never sees half a device.
    """
    sys_dir = root / "sys"
    devices = sys_dir / "devices"
    files: dict[str, dict[str, str]] = {}
    links: dict[Path, str] = {}
    parents = gpu_parents(state)
    for bdf, attrs in sysfs_files(state).items():
        chain = parents.get(bdf, [])
        rel = "/".join([ROOT_BUS, *(p for p, _ in chain), bdf])
        for depth, (_, removable) in enumerate(chain):
            d = "/".join([ROOT_BUS, *(p for p, _ in chain[: depth + 1])])
            files.setdefault(d, {})["removable"] = "removable" if removable else "fixed"
        docked = any(r for _, r in chain)
        files[rel] = {**attrs, "removable": "removable" if docked else "fixed"}
        links[sys_dir / "bus" / "pci" / "devices" / bdf] = rel
    for rel, attrs in tb_files(state).items():
        files[rel] = attrs
        links[sys_dir / "bus" / "thunderbolt" / "devices" / rel.rsplit("/", 1)[1]] = rel
    for bus in ("pci", "thunderbolt"):
        base = sys_dir / "bus" / bus / "devices"
        base.mkdir(parents=True, exist_ok=True)
        for name in os.listdir(base):
            entry = base / name
            target = links.get(entry)
            if target is not None and entry.is_symlink() and os.readlink(entry) == f"../../../devices/{target}":
                continue
            if entry.is_symlink():
                entry.unlink()
            elif entry.is_dir():
                shutil.rmtree(entry)  # an older flat layout
    _prune(devices, {devices / rel for rel in files})
    for rel, attrs in files.items():
        ddir = devices / rel
        ddir.mkdir(parents=True, exist_ok=True)
        for fname, text in attrs.items():
            f = ddir / fname
            if not f.exists() or f.read_text(encoding="utf-8") != text + "\n":
                f.write_text(text + "\n", encoding="utf-8")
    for link, rel in links.items():
        if not link.is_symlink():
            link.symlink_to(f"../../../devices/{rel}")
    mirror_host(root, state)  # /proc, /sys/module and /dev of the same host (gpuwatchd doctor reads them)


def _prune(devices: Path, keep: set[Path]) -> None:
    """Remove every directory under ``devices`` that is neither kept nor an ancestor of a kept one."""
    if not devices.is_dir():
        return
    ancestors = {a for k in keep for a in k.parents}
    for dirpath, dirnames, _ in os.walk(devices, topdown=True):
        here = Path(dirpath)
        for name in list(dirnames):
            d = here / name
            if d not in keep and d not in ancestors:
                shutil.rmtree(d)
                dirnames.remove(name)
