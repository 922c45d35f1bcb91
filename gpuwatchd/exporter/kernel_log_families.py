"""Families of the kernel-log source (``sources/kmsg/ingest.py``; docs/kernel-log.md). Nothing when it is off."""

from __future__ import annotations

from prometheus_client.core import Metric

from gpuwatchd.exporter.families import Families, spec
from gpuwatchd.store import Store

KLOG_UP = spec(
    "gpuwatchd_kernel_log_up", "gauge",
    "1 while the kernel log (/dev/kmsg) is being read, 0 when it cannot be (the reason is in"
    " gpuwatchd_kernel_log_error_info and the daemon log). Absent when kernel_log.enabled is false.",
)
KLOG_ERROR = spec(
    "gpuwatchd_kernel_log_error_info", "info",
    "Why the kernel log cannot be read (e.g. permission denied under kernel.dmesg_restrict=1 without CAP_SYSLOG);"
    " present only while gpuwatchd_kernel_log_up is 0.",
    ("reason",),
)
KLOG_LINES = spec(
    "gpuwatchd_kernel_log_lines_total", "counter",
    "Kernel-log lines read, by what they were decoded as: xid, sxid, gpu_address (NVRM: GPU at PCI:... GPU-uuid),"
    " fallen_off_bus, rm_init_failed, version_mismatch, driver_loaded, aer, pciehp, thunderbolt, other.",
    ("kind",),
)
KLOG_LOST = spec(
    "gpuwatchd_kernel_log_records_lost_total", "counter",
    "Kernel-log records overwritten in the ring buffer before the daemon read them (gaps in sequence numbers).",
)
KLOG_CUT = spec(
    "gpuwatchd_kernel_log_records_cut_total", "counter",
    "Kernel-log records longer than the reader's limit (16 KiB; /dev/kmsg's are at most ~8 KiB), cut to it and"
    " parsed from their start.",
)
FALLEN = spec(
    "gpuwatchd_gpu_fallen_off_bus_total", "counter",
    "Times the kernel log said the GPU fell off the bus (Xid 79 or 'GPU has fallen off the bus'; reports of one"
    " GPU within a minute are one fall). uuid=unknown when the address maps to no GPU the daemon knows.",
    ("uuid",),
)
AER = spec(
    "gpuwatchd_pcie_aer_errors_total", "counter",
    "PCIe AER errors the kernel logged on the GPU or a port above it, by severity (corrected, nonfatal, fatal)."
    " uuid=unknown when the port is above no single known GPU.",
    ("uuid", "severity"),
)
XID_REPORTS = spec(
    "gpuwatchd_gpu_xid_reports_total", "counter",
    "Xid reports per path before de-duplication: source=nvml (NVML events) or kmsg (kernel log). An Xid seen by"
    " both is one report on each and one count in gpuwatchd_gpu_xid_errors_total.",
    ("uuid", "xid", "source"),
)

SXID = spec(
    "gpuwatchd_nvswitch_sxid_errors_total", "counter",
    "NVSwitch errors the nvidia-nvswitch driver logged (SXid lines, one per error: the Fatal / Non-fatal headline),"
    " by switch (its PCI address) and sxid code. Absent on hosts without NVSwitches.",
    ("switch", "sxid"),
)
SXID_FATAL = spec(
    "gpuwatchd_nvswitch_sxid_fatal_errors_total", "counter",
    "The fatal ones among gpuwatchd_nvswitch_sxid_errors_total (the line said Fatal): NVLink traffic through the"
    " switch stalls until the GPUs and switches are reset.",
    ("switch", "sxid"),
)


def kernel_log_families(store: Store) -> list[Metric]:
    stats = store.kernel_log
    f = Families()
    if stats is None:
        return []
    f.add(KLOG_UP, (), stats.up)
    if not stats.up and stats.error:
        f.info(KLOG_ERROR, {"reason": stats.error})
    for kind, count in stats.lines.items():
        f.add(KLOG_LINES, (kind,), count)
    f.add(KLOG_LOST, (), stats.records_lost)
    f.add(KLOG_CUT, (), stats.records_cut)
    for uuid, count in sorted(stats.fallen_off_bus.items()):
        f.add(FALLEN, (uuid,), count)
    for (uuid, severity), count in sorted(stats.aer.items()):
        f.add(AER, (uuid, severity), count)
    for key, count in sorted(stats.xid_reports.items()):
        f.add(XID_REPORTS, key, count)
    for (switch, code), count in sorted(stats.sxid.items()):
        f.add(SXID, (switch, code), count)
    for (switch, code), count in sorted(stats.sxid_fatal.items()):
        f.add(SXID_FATAL, (switch, code), count)
    return f.metrics()
