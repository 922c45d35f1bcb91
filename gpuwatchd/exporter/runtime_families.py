"""Families about the daemon and the fleet rather than one GPU's readings: NVML status, presence and identity,
Xid counters, the sysfs PCIe view, per-source self-metrics, build info and config reload status."""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata

from prometheus_client.core import Metric

import gpuwatchd
from gpuwatchd.exporter.families import Families, label, spec
from gpuwatchd.model import LinkSample
from gpuwatchd.store import Store

# -- NVML and the worker --------------------------------------------------------------------------------------
NVML_UP = spec(
    "gpuwatchd_nvml_up", "gauge",
    "1 when the last NVML poll initialised NVML and enumerated GPUs, 0 when NVML failed"
    " (see gpuwatchd_nvml_error_info). Absent until the first poll.",
)
NVML_ERROR = spec(
    "gpuwatchd_nvml_error_info", "info",
    "Why NVML is down, as a short reason (library_not_found, driver_not_loaded, timeout, ...); present only while"
    " gpuwatchd_nvml_up is 0.",
    ("reason",),
)
NVML_STALE = spec(
    "gpuwatchd_nvml_stale", "gauge",
    "1 when the last NVML poll missed its deadline and the values shown are held from the poll before, else 0.",
)
NVML_RESTARTS = spec(
    "gpuwatchd_nvml_worker_restarts_total", "counter",
    "Times the NVML worker process was restarted (hung poll, crash, or re-enumeration after a GPU was lost).",
)
NVML_INIT_FAILURES = spec(
    "gpuwatchd_nvml_init_failures_total", "counter",
    "Retries of an NVML initialisation that failed (no driver, driver/library mismatch, ...); kept apart from"
    " worker restarts so a host without a driver does not look like a crash loop.",
)
NVML_DEVICES = spec(
    "gpuwatchd_nvml_devices", "gauge", "Device count NVML reported on the last successful poll (lost ones included)."
)
NVML_LOST = spec(
    "gpuwatchd_nvml_lost_devices", "gauge",
    "Devices NVML enumerates but cannot read (GPU_IS_LOST or similar) on the last poll.",
)
DRIVER_INFO = spec(
    "gpuwatchd_driver_info", "info", "NVIDIA driver, NVML and CUDA driver API versions.",
    ("driver_version", "nvml_version", "cuda_driver_version"),
)
LAST_POLL = spec(
    "gpuwatchd_last_poll_timestamp_seconds", "gauge",
    "When the last NVML snapshot was received (values on this page are from that poll).", unit="seconds",
)
POLL_DURATION = spec(
    "gpuwatchd_poll_duration_seconds", "gauge", "How long the last NVML poll took in the worker.", unit="seconds"
)

# -- presence and identity ------------------------------------------------------------------------------------
GPU_INFO = spec(
    "gpuwatchd_gpu_info", "info",
    "Identity of every GPU seen since start, present or not. Join on uuid to get names, index and bus ids.",
    ("uuid", "index", "name", "pci_bus_id", "driver_version"),
)
GPU_PRESENT = spec(
    "gpuwatchd_gpu_present", "gauge",
    "1 while the GPU is present, 0 once it is lost (GPU_IS_LOST, fallen off the bus) or removed (gone from"
    " enumeration, e.g. eGPU unplugged). A GPU that is not present exports no other readings.",
    ("uuid",),
)
GPU_LOST = spec(
    "gpuwatchd_gpu_lost", "gauge",
    "1 while the GPU is enumerated but answers GPU_IS_LOST (fallen off the bus), else 0; tells lost from removed"
    " when gpuwatchd_gpu_present is 0.",
    ("uuid",),
)
GPU_LAST_SEEN = spec(
    "gpuwatchd_gpu_last_seen_timestamp_seconds", "gauge", "When the GPU last answered a poll with readings.",
    ("uuid",), "seconds",
)
GPU_READING_AGE = spec(
    "gpuwatchd_gpu_reading_age_seconds", "gauge",
    "Seconds since this present GPU's readings were last refreshed by a poll (the daemon's clock, at most 1 s"
    " behind): grows while polls are late or while the GPU's NVML calls block and its last readings are held.",
    ("uuid",), "seconds",
)
GPUS = spec("gpuwatchd_gpus", "gauge", "Number of GPUs present.")

# -- Xid --------------------------------------------------------------------------------------------------------
XID = spec(
    "gpuwatchd_gpu_xid_errors_total", "counter",
    "Xid errors seen since the daemon started, per Xid code (NVML events and kernel log). uuid=unknown when the"
    " message named no GPU the daemon knows.",
    ("uuid", "xid"),
)
SERIES_DROPPED = spec(
    "gpuwatchd_series_dropped_total", "counter",
    "Events not counted in a family because it reached its series limit (1024 label sets; label values from the"
    " kernel log or NVML events, e.g. forged Xid codes or PCI addresses). The family's existing series go on"
    " counting. Absent until a limit is reached.",
    ("family",),
)
STATE_SET_ASIDE = spec(
    "gpuwatchd_state_file_set_aside_total", "counter",
    "State files found unreadable, corrupt or foreign at start and moved aside to <name>.corrupt-<UTC time>"
    " (the daemon started without them): kernel_log (kernel-log.json), rule_history (rule-history.z),"
    " probe_baselines (probe-baselines.json). Absent until one is.",
    ("file",),
)

# -- sysfs PCIe view ------------------------------------------------------------------------------------------
_B = ("pci_bus_id",)
SYSFS_PRESENT = spec(
    "gpuwatchd_sysfs_pcie_device_present", "gauge",
    "1 while the PCI device is in sysfs, 0 after it disappeared (read without NVML, so it works when NVML hangs)."
    " pci_bus_id is in NVML form to join with gpuwatchd_gpu_info.",
    _B,
)
SYSFS_GEN = spec("gpuwatchd_sysfs_pcie_link_generation", "gauge", "Current PCIe link generation (sysfs).", _B)
SYSFS_MAX_GEN = spec("gpuwatchd_sysfs_pcie_link_max_generation", "gauge", "Maximum PCIe link generation (sysfs).", _B)
SYSFS_WIDTH = spec("gpuwatchd_sysfs_pcie_link_width", "gauge", "Current PCIe link width in lanes (sysfs).", _B)
SYSFS_MAX_WIDTH = spec("gpuwatchd_sysfs_pcie_link_max_width", "gauge", "Maximum PCIe link width in lanes (sysfs).", _B)

# -- the daemon itself ----------------------------------------------------------------------------------------
SOURCE_SUCCESS = spec(
    "gpuwatchd_source_success", "gauge", "1 when the source's last collection worked, 0 when it failed.", ("source",)
)
SOURCE_DURATION = spec(
    "gpuwatchd_source_duration_seconds", "gauge", "How long the source's last collection took.", ("source",),
    "seconds",
)
SOURCE_LAST_RUN = spec(
    "gpuwatchd_source_last_run_timestamp_seconds", "gauge", "When the source last ran.", ("source",), "seconds"
)
BUILD_INFO = spec(
    "gpuwatchd_build_info", "info", "Versions of gpuwatchd, Python and the NVML bindings (nvidia-ml-py).",
    ("version", "python", "pynvml"),
)
CONFIG_OK = spec(
    "gpuwatchd_config_last_reload_successful", "gauge",
    "1 when the last config (re)load succeeded, 0 when it failed and the previous config is still in use.",
)
CONFIG_TS = spec(
    "gpuwatchd_config_last_reload_success_timestamp_seconds", "gauge",
    "When the config was last loaded successfully.", unit="seconds",
)


@dataclass(frozen=True, slots=True)
class BuildInfo:
    """Versions for gpuwatchd_build_info; read once at start-up (package metadata is file I/O)."""

    version: str
    python: str
    pynvml: str

    @classmethod
    def detect(cls) -> BuildInfo:
        try:
            nvml = metadata.version("nvidia-ml-py")
        except metadata.PackageNotFoundError:
            nvml = "none"
        return cls(gpuwatchd.__version__, platform.python_version(), nvml)


def nvml_families(store: Store) -> list[Metric]:
    """NVML up/error, staleness, worker restarts, driver versions and poll timing."""
    f = Families()
    f.add(NVML_RESTARTS, (), store.nvml_worker_restarts)
    f.add(NVML_INIT_FAILURES, (), store.nvml_init_failures)
    snap = store.latest
    if snap is None:
        return f.metrics()
    f.add(NVML_UP, (), snap.nvml_ok)
    if not snap.nvml_ok:
        f.info(NVML_ERROR, {"reason": snap.nvml_error or "unknown"})
    f.add(NVML_STALE, (), store.stale)
    if snap.nvml_ok:
        f.add(NVML_DEVICES, (), snap.device_count)
        f.add(NVML_LOST, (), len(snap.lost))
    if snap.driver_version is not None:
        f.info(
            DRIVER_INFO,
            {
                "driver_version": snap.driver_version,
                "nvml_version": label(snap.nvml_version),
                "cuda_driver_version": label(snap.cuda_driver_version),
            },
        )
    f.add(LAST_POLL, (), snap.timestamp)
    f.add(POLL_DURATION, (), snap.poll_duration_seconds)
    return f.metrics()


def presence_families(store: Store, driver: str | None = None, now: float | None = None) -> list[Metric]:
    """Identity and presence of every GPU seen since start.

    ``driver``: the last driver version known, so ``gpu_info`` keeps its labels (its identity) while NVML is down.
    ``now``: the daemon's clock, for the age of present GPUs' readings (no age family without it).
    """
    f = Families()
    if store.latest is not None and store.latest.driver_version is not None:
        driver = store.latest.driver_version
    present = 0
    for uuid, pres in sorted(store.presence.items(), key=lambda kv: (kv[1].identity.index, kv[0])):
        ident = pres.identity
        f.info(
            GPU_INFO,
            {
                "uuid": uuid,
                "index": str(ident.index),
                "name": label(ident.name),
                "pci_bus_id": label(ident.pci_bus_id),
                "driver_version": label(driver),
            },
        )
        f.add(GPU_PRESENT, (uuid,), pres.state == "present")
        f.add(GPU_LOST, (uuid,), pres.state == "lost")
        f.add(GPU_LAST_SEEN, (uuid,), pres.last_seen)
        if now is not None and pres.state == "present":
            f.add(GPU_READING_AGE, (uuid,), max(0.0, now - pres.last_seen))
        present += pres.state == "present" and ident.parent_uuid is None  # GPUs, not their MIG devices
    if store.latest is not None or store.presence:
        f.add(GPUS, (), present)
    return f.metrics()


def xid_families(store: Store) -> list[Metric]:
    """Xid counters of every GPU, gone ones included (and of Xids that named no known GPU).

    A gone GPU exports no readings, but its Xid counters are counts of events that happened, not readings: Xid 79
    arrives in the same poll as (or just before) GPU_IS_LOST, and dropping the counter with the GPU would hide the
    one event that says why it went.
    """
    f = Families()
    for (uuid, xid), count in sorted(store.xid_counts.items()):
        f.add(XID, (uuid, str(xid)), count)
    for family, count in sorted(store.series_dropped.items()):
        f.add(SERIES_DROPPED, (family,), count)
    for file, count in sorted(store.state_files_set_aside.items()):
        f.add(STATE_SET_ASIDE, (file,), count)
    return f.metrics()


def nvml_bus_id(sysfs_bus_id: str) -> str:
    """``0000:0c:00.0`` (sysfs) -> ``00000000:0C:00.0`` (NVML); anything unparsable is returned unchanged."""
    try:
        domain, bus, devfn = sysfs_bus_id.split(":")
        dev, fn = devfn.split(".")
        return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(dev, 16):02X}.{int(fn, 16):X}"
    except ValueError:
        return sysfs_bus_id


def link_families(links: Mapping[str, LinkSample]) -> list[Metric]:
    """The PCIe link as sysfs shows it, independent of NVML."""
    f = Families()
    for bus_id, link in sorted(links.items()):
        b = (nvml_bus_id(bus_id),)
        f.add(SYSFS_PRESENT, b, link.present)
        if not link.present:
            continue
        f.add(SYSFS_GEN, b, link.current_generation)
        f.add(SYSFS_MAX_GEN, b, link.max_generation)
        f.add(SYSFS_WIDTH, b, link.current_width)
        f.add(SYSFS_MAX_WIDTH, b, link.max_width)
    return f.metrics()


def self_families(store: Store, build: BuildInfo) -> list[Metric]:
    """Per-source success and duration, build info, config reload status."""
    f = Families()
    for name, status in sorted(store.sources.items()):
        f.add(SOURCE_SUCCESS, (name,), status.success)
        f.add(SOURCE_DURATION, (name,), status.duration_seconds)
        f.add(SOURCE_LAST_RUN, (name,), status.timestamp)
    f.info(BUILD_INFO, {"version": build.version, "python": build.python, "pynvml": build.pynvml})
    f.add(CONFIG_OK, (), store.config_reload_success)
    f.add(CONFIG_TS, (), store.config_reload_timestamp)
    return f.metrics()
