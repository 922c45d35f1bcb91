"""PCI bus ids in NVML's and sysfs' spellings (pure string functions, no I/O)."""

from __future__ import annotations


def sysfs_bus_id(bus_id: str) -> str:
    """NVML ``00000000:0C:00.0`` (8-digit domain, upper case) -> sysfs ``0000:0c:00.0``; sysfs form passes through."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if not sep:
        return bus_id
    if "." not in rest:
        rest += ".0"  # kernel-log form has no function
    return f"{int(domain, 16):04x}:{rest}"
