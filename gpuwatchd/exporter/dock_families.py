"""Families about Thunderbolt/USB4 docks and eGPU enclosures (``sources/sysfs/thunderbolt.py``), keyed by
``unique_id``."""

from __future__ import annotations

from prometheus_client.core import Metric

from gpuwatchd.exporter.families import Families, spec
from gpuwatchd.store import Store

_U = ("unique_id",)
_UD = ("unique_id", "direction")
TB_INFO = spec(
    "gpuwatchd_thunderbolt_device_info", "info",
    "A Thunderbolt/USB4 device attached now (dock, eGPU enclosure), from /sys/bus/thunderbolt; one series per GPU"
    " behind it (gpu_uuid, tied through the PCI topology), gpu_uuid=\"\" when none is. generation: 1-3 Thunderbolt,"
    " 4 USB4.",
    ("unique_id", "vendor", "name", "generation", "gpu_uuid"),
)
TB_AUTHORIZED = spec(
    "gpuwatchd_thunderbolt_device_authorized", "gauge",
    "1 when the device is authorized (its PCIe tunnel is up), 0 when it is attached but not authorized, so no"
    " GPU behind it can appear (boltctl enroll, or the BIOS Thunderbolt security level).",
    _U,
)
TB_SPEED = spec(
    "gpuwatchd_thunderbolt_link_speed_bytes_per_second", "gauge",
    "Speed of each lane of the device's upstream link as trained, per direction (rx, tx; sysfs rx_speed/tx_speed)."
    " The link carries this times gpuwatchd_thunderbolt_link_lanes. In bytes (base unit): 2.5e9 is a 20 Gb/s"
    " lane.",
    _UD, "bytes_per_second",
)
TB_LANES = spec(
    "gpuwatchd_thunderbolt_link_lanes", "gauge",
    "Lanes the device's upstream link uses, per direction (rx, tx; sysfs rx_lanes/tx_lanes); 2 on a healthy"
    " Thunderbolt 3/4 or USB4 link.",
    _UD,
)


def _bytes(bits_per_second: float | None) -> float | None:
    """sysfs and the model speak bits per second (as link speeds are quoted); the exposition speaks bytes."""
    return None if bits_per_second is None else bits_per_second / 8


def dock_families(store: Store) -> list[Metric]:
    """Docks attached now: identity (with the GPUs behind each), authorization, link speed and width."""
    f = Families()
    for d in sorted(store.docks, key=lambda d: d.unique_id):
        gen = "" if d.generation is None else str(d.generation)
        base = {"unique_id": d.unique_id, "vendor": d.vendor or "", "name": d.name or "", "generation": gen}
        for uuid in store.dock_gpu_uuids(d) or [""]:
            f.info(TB_INFO, {**base, "gpu_uuid": uuid})
        u = (d.unique_id,)
        f.add(TB_AUTHORIZED, u, d.authorized)
        f.add(TB_SPEED, (d.unique_id, "rx"), _bytes(d.rx_speed_bps))
        f.add(TB_SPEED, (d.unique_id, "tx"), _bytes(d.tx_speed_bps))
        f.add(TB_LANES, (d.unique_id, "rx"), d.rx_lanes)
        f.add(TB_LANES, (d.unique_id, "tx"), d.tx_lanes)
    return f.metrics()
