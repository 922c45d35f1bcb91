"""dcgm-exporter compatible names (``exporter.compat: dcgm``): its default counters under their ``DCGM_FI_*`` names.

What dcgm-exporter exports by default is its ``etc/default-counters.csv`` (NVIDIA/dcgm-exporter, release
4.5.3-4.8.2, commit 691c927); the labels are those of its renderer, ``internal/pkg/rendermetrics/render_metrics.go``
(``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``GPU_I_PROFILE``/``GPU_I_ID`` on MIG instances,
``Hostname``) plus the csv's one ``label`` counter, ``DCGM_FI_DRIVER_VERSION``. Each counter here is read from the
same ``GpuSample`` the native families use, converted to DCGM's unit; docs/dcgm-compat.md says which map exactly,
which with a conversion, and which cannot. A reading gpuwatchd does not have gives no sample (DCGM skips blank
values the same way), never 0.

DCGM types some of these ``counter`` without a ``_total`` suffix; a Prometheus client appends ``_total`` to a
counter and ``promtool check metrics`` refuses one without it, so they are exposed untyped under DCGM's exact name
(PromQL's rate/increase do not look at the type).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuwatchd.exporter.collector import present_gpus
from gpuwatchd.exporter.encode import freeze
from gpuwatchd.exporter.families import label
from gpuwatchd.model import GpuSample
from gpuwatchd.rules.xid import CATALOG
from gpuwatchd.store import Store

log = logging.getLogger(__name__)

MIB = float(1 << 20)
MHZ = 1e6
ERROR_LOG_INTERVAL_SECONDS = 60.0
# dcgm-exporter's help for an Xid it has no text for (internal/pkg/collector/xid_errors.go, unknownErr)
UNKNOWN_XID = "Unknown Error"

Read = Callable[[GpuSample], float | None]


@dataclass(frozen=True, slots=True)
class Counter:
    """One dcgm-exporter default counter: its name, exposition type and help as in default-counters.csv."""

    name: str
    kind: Literal["gauge", "unknown"]
    help: str
    read: Read


def _scaled(get: Callable[[GpuSample], float | None], factor: float) -> Read:
    def read(g: GpuSample) -> float | None:
        v = get(g)
        return None if v is None else v * factor

    return read


def _flag(v: bool | None) -> float | None:
    return None if v is None else float(v)


def _pcie(direction: str, nvml: Callable[[GpuSample], float | None]) -> Read:
    """PCIe bytes/s: GPM's rate between two polls where the GPU has GPM, else NVML's 20 ms throughput sample."""

    def read(g: GpuSample) -> float | None:
        v = g.gpm_pcie_bytes_per_second.get(direction)
        return v if v is not None else nvml(g)

    return read


# In default-counters.csv order (commented-out counters are not exported by dcgm-exporter either).
COUNTERS: tuple[Counter, ...] = (
    Counter("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
            _scaled(lambda g: g.clocks_hz.get("sm"), 1 / MHZ)),
    Counter("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
            _scaled(lambda g: g.clocks_hz.get("memory"), 1 / MHZ)),
    Counter("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", lambda g: g.memory_temperature_celsius),
    Counter("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda g: g.temperature_celsius),
    Counter("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda g: g.power_watts),
    Counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "unknown", "Total energy consumption since boot (in mJ).",
            _scaled(lambda g: g.energy_joules, 1000.0)),
    Counter("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "unknown", "Total number of PCIe retries.",
            lambda g: g.pcie_replay_total),
    Counter("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).",
            _scaled(lambda g: g.utilization_gpu_ratio, 100.0)),
    Counter("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
            _scaled(lambda g: g.utilization_memory_ratio, 100.0)),
    Counter("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).",
            _scaled(lambda g: g.encoder_utilization_ratio, 100.0)),
    Counter("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).",
            _scaled(lambda g: g.decoder_utilization_ratio, 100.0)),
    # DCGM_FI_DEV_XID_ERRORS: from the store's Xid events, see _xid_family
    Counter("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
            _scaled(lambda g: g.memory_free_bytes, 1 / MIB)),
    Counter("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
            _scaled(lambda g: g.memory_used_bytes, 1 / MIB)),
    Counter("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).",
            _scaled(lambda g: g.memory_reserved_bytes, 1 / MIB)),
    # DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, DCGM_FI_DEV_VGPU_LICENSE_STATUS: cannot map (docs/dcgm-compat.md)
    Counter("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "unknown", "Number of remapped rows for uncorrectable errors",
            lambda g: g.remapped_rows_uncorrectable),
    Counter("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "unknown", "Number of remapped rows for correctable errors",
            lambda g: g.remapped_rows_correctable),
    Counter("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
            lambda g: _flag(g.remapped_rows_failure)),
    Counter("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
            lambda g: g.gpm_graphics_activity_ratio),
    Counter("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
            lambda g: g.gpm_tensor_activity_ratio),
    Counter("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
            "Ratio of cycles the device memory interface is active sending or receiving data.",
            lambda g: g.gpm_dram_activity_ratio),
    Counter("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
            "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in "
            "bytes per second.", _pcie("tx", lambda g: g.pcie_tx_bytes_per_second)),
    Counter("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
            "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in "
            "bytes per second.", _pcie("rx", lambda g: g.pcie_rx_bytes_per_second)),
)
XID = Counter("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", lambda g: None)
NAMES = (*(c.name for c in COUNTERS), XID.name)


def gpu_labels(g: GpuSample, by_uuid: dict[str, GpuSample], host: str, driver: str | None) -> dict[str, str]:
    """dcgm-exporter's labels of one device: a MIG instance carries its GPU's index, UUID and PCI address plus
    GPU_I_PROFILE / GPU_I_ID, as DCGM labels instance entities (render_metrics.go, gpu_collector.go toMetric)."""
    parent_uuid = g.parent_uuid
    gpu = by_uuid.get(parent_uuid, g) if parent_uuid else g
    labels = {"gpu": str(g.index), "UUID": parent_uuid or g.uuid, "pci_bus_id": label(g.pci_bus_id or gpu.pci_bus_id),
              "device": f"nvidia{g.index}", "modelName": label(gpu.name)}
    if parent_uuid:
        labels["GPU_I_PROFILE"] = label(g.profile)
        labels["GPU_I_ID"] = label(g.gpu_instance_id)
    labels["Hostname"] = host
    if driver:
        labels["DCGM_FI_DRIVER_VERSION"] = driver  # default-counters.csv: a "label" counter, on every metric
    return labels


def dcgm_families(gpus: list[GpuSample], host: str, driver: str | None) -> list[Metric]:
    """The per-GPU ``DCGM_FI_*`` families of the present GPUs (and MIG instances)."""
    by_uuid = {g.uuid: g for g in gpus}
    labels = [gpu_labels(g, by_uuid, host, driver) for g in gpus]
    out = []
    for c in COUNTERS:
        fam: Metric | None = None
        for g, lab in zip(gpus, labels, strict=True):
            v = c.read(g)
            if v is None:
                continue
            if fam is None:
                fam = Metric(c.name, c.help, c.kind)
            fam.add_sample(c.name, lab, float(v))
        if fam is not None:
            out.append(fam)
    return out


def xid_family(store: Store, gpus: list[GpuSample], host: str, driver: str | None) -> Metric | None:
    """``DCGM_FI_DEV_XID_ERRORS``: the last Xid of each present GPU, with dcgm-exporter's err_code / err_msg
    labels (the message from gpuwatchd's Xid catalog, rules/xid.py). A GPU without an Xid has no sample."""
    last: dict[str, int] = {}
    for ev in store.recent_xids:  # oldest first: the last one seen wins
        if ev.uuid is not None:
            last[ev.uuid] = ev.xid
    if not last:
        return None
    by_uuid = {g.uuid: g for g in gpus}
    fam: Metric | None = None
    for g in gpus:
        xid = last.get(g.uuid)
        if xid is None:
            continue
        info = CATALOG.get(xid)
        lab = {**gpu_labels(g, by_uuid, host, driver), "err_code": str(xid),
               "err_msg": info.meaning if info is not None else UNKNOWN_XID}
        if fam is None:
            fam = Metric(XID.name, XID.help, XID.kind)
        fam.add_sample(XID.name, lab, float(xid))
    return fam


class DcgmCompatCollector(Collector):
    """The ``DCGM_FI_*`` families, built once per set of GPU samples (like the store collector's per-GPU groups)
    and never failing a scrape: a bug here is logged (at most once a minute) and the families are left out."""

    def __init__(self, store: Store, host: str, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._host = host
        self._monotonic = monotonic
        self._built: tuple[list[GpuSample], str | None, list[Metric]] | None = None
        self._driver: str | None = None
        self._last_logged: float | None = None
        self.errors = 0

    def describe(self) -> Iterable[Metric]:
        return [Metric(c.name, c.help, c.kind) for c in (*COUNTERS, XID)]

    def collect(self) -> Iterable[Metric]:
        try:
            metrics = self._collect()
        except Exception:
            self.errors += 1
            now = self._monotonic()
            if self._last_logged is None or now - self._last_logged >= ERROR_LOG_INTERVAL_SECONDS:
                self._last_logged = now
                log.exception("dcgm-compatible families failed and were left out of the scrape (%d times so far)",
                              self.errors)
            return []
        return metrics

    def _collect(self) -> list[Metric]:
        store = self._store
        if store.latest is not None and store.latest.driver_version is not None:
            self._driver = store.latest.driver_version
        gpus = present_gpus(store)
        built = self._built
        if built is None or built[1] != self._driver or len(built[0]) != len(gpus) or any(
                a is not b for a, b in zip(built[0], gpus, strict=True)):
            built = self._built = (gpus, self._driver, [freeze(m) for m in dcgm_families(gpus, self._host,
                                                                                            self._driver)])
        xid = xid_family(store, gpus, self._host, self._driver)
        return built[2] if xid is None else [*built[2], xid]
