"""`gpuwatchd sim --from-xml X --kernel-log L`: a whole incident replayed through a real daemon process; the Xid
counters are the ones the log implies, keyed by the capture's GPUs (by PCI address), and the Xid alerts fire with
the severities of their codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import DaemonProcess, metrics_when, value, wait_until
from test_sim_cli import interrupt, sim, start_sim  # sim: the fixture that kills what a test left running

__all__ = ["sim"]  # used as a fixture

XML = Path(__file__).resolve().parents[1] / "sim" / "fixtures" / "two_gpus.xml"
GPU_17 = "GPU-11111111-0002-4000-8000-000000000017"  # the capture's GPU at 00000000:17:00.0
GPU_CA = "GPU-22222222-0002-4000-8000-0000000000ca"  # ... and at 00000000:CA:00.0

# `dmesg -T` as pasted from a real incident: a DBE with its row remap on bus 17, an app fault twice on bus ca, then
# bus ca falls off the bus. The driver's "GPU at" line for ca names the UUID the kernel had; the capture's GPU at
# that address is the one the counters and alerts belong to. Noise lines are ignored, not errors.
LOG = """\
[Sun Feb 23 16:24:10 2025] usb 1-1: new high-speed USB device number 2 using xhci_hcd
[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:17:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable DBE
[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:17:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row marked
[Sun Feb 23 16:25:02 2025] NVRM: Xid (PCI:0000:ca:00): 13, pid=4242, name=python3, Graphics SM Warp Exception
[Sun Feb 23 16:25:03 2025] NVRM: Xid (PCI:0000:ca:00): 13, pid=4242, name=python3, Graphics SM Warp Exception
[Sun Feb 23 16:25:40 2025] pcieport 0000:c9:00.0: AER: Corrected error received: 0000:ca:00.0
[Sun Feb 23 16:26:00 2025] NVRM: GPU at PCI:0000:ca:00: GPU-22222222-0002-4000-8000-0000000000ca
[Sun Feb 23 16:26:00 2025] NVRM: Xid (PCI:0000:ca:00): 79, pid=4242, name=python3, GPU has fallen off the bus.
[Sun Feb 23 16:26:00 2025] NVRM: GPU at 0000:ca:00.0 has fallen off the bus.
[Sun Feb 23 16:26:00 2025] NVRM: A GPU crash dump has been created. If possible, please run
                           NVRM: nvidia-bug-report.sh as root to collect this data before
"""


def test_replayed_incident_counts_and_alerts(sim: list[DaemonProcess], tmp_path: Path) -> None:
    log = tmp_path / "incident.log"
    log.write_text(LOG)
    d = start_sim(sim, tmp_path, "--from-xml", str(XML), "--kernel-log", str(log))
    m = metrics_when(d, lambda m: value(m, "gpuwatchd_gpu_fallen_off_bus_total", uuid=GPU_CA) == 1,
                     "the replayed log read")
    xids = {(dict(labels)["uuid"], dict(labels)["xid"]): v for (name, labels), v in m.items()
            if name == "gpuwatchd_gpu_xid_errors_total"}
    assert xids == {(GPU_17, "48"): 1, (GPU_17, "63"): 1, (GPU_CA, "13"): 2, (GPU_CA, "79"): 1}
    assert value(m, "gpuwatchd_gpu_xid_reports_total", uuid=GPU_CA, xid="13", source="kmsg") == 2
    assert value(m, "gpuwatchd_kernel_log_up") == 1
    assert value(m, "gpuwatchd_kernel_log_lines_total", kind="xid") == 5
    assert value(m, "gpuwatchd_kernel_log_lines_total", kind="fallen_off_bus") == 1
    assert value(m, "gpuwatchd_kernel_log_lines_total", kind="other") == 3  # usb, crash dump (2 lines)
    assert value(m, "gpuwatchd_pcie_aer_errors_total", uuid=GPU_CA, severity="corrected") == 1

    def alerts() -> dict[tuple[str, str, str], str] | None:
        status, body = d.get("/api/v1/alerts")
        assert status == 200
        got = {(a["labels"]["alertname"], a["labels"]["uuid"], a["labels"].get("xid", "")): a["labels"]["severity"]
               for a in json.loads(body) if a["state"] == "firing"}
        return got if len(got) >= 5 else None

    firing = wait_until(alerts, "the Xid alerts and GpuLost to fire")
    assert firing == {
        ("GpuXidError", GPU_17, "48"): "critical",
        ("GpuXidError", GPU_17, "63"): "info",
        ("GpuXidError", GPU_CA, "13"): "warning",
        ("GpuXidError", GPU_CA, "79"): "critical",
        ("GpuLost", GPU_CA, ""): "critical",  # from the kernel's word alone: NVML (the capture) still answers
    }
    assert interrupt(d) == 0


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p, "file not found"),
    (lambda p: Path("/dev/zero"), "not a regular file (a device)"),
    (lambda p: p.parent, "is a directory"),
])
def test_unusable_kernel_log_is_one_clear_line(tmp_path: Path, make: object, message: str) -> None:
    import subprocess
    import sys

    from support import ROOT

    assert callable(make)
    path = make(tmp_path / "missing.log")
    r = subprocess.run([sys.executable, "-m", "gpuwatchd", "sim", "--from-xml", str(XML), "--kernel-log", str(path)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpuwatchd sim: --kernel-log ") and message in lines[0], r.stderr


DEDUP_SCENARIO = """\
name: xid-both-paths
description: One GPU; an app fault (Xid 13) reported by NVML events and by the kernel log at the same moment.
gpus: 1
devices:
  all:
    uuid: GPU-0d0d0d0d-0000-4000-8000-00000000dd01
    pci: {domain: 0, bus: 0x3b, device: 0}
timeline:
  - at: 4
    xid: {gpu: 0, code: 13}
  - at: 4
    kmsg: ["NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python3, Graphics SM Warp Exception"]
"""


def test_nvml_event_and_kernel_line_of_one_xid_count_once(sim: list[DaemonProcess], tmp_path: Path) -> None:
    # Through the stand-in driver's event path (nvmlEventSetWait -> worker -> supervisor) and the sim's ring.
    path = tmp_path / "xid-both.yml"
    path.write_text(DEDUP_SCENARIO)
    d = start_sim(sim, tmp_path, "--scenario", str(path), "--speed", "2")
    uuid = "GPU-0d0d0d0d-0000-4000-8000-00000000dd01"
    m = metrics_when(d, lambda m: value(m, "gpuwatchd_gpu_xid_reports_total", uuid=uuid, xid="13", source="nvml") == 1
                     and value(m, "gpuwatchd_gpu_xid_reports_total", uuid=uuid, xid="13", source="kmsg") == 1,
                     "the Xid from both paths")
    xids = {(n, tuple(sorted(dict(lb).items()))): v for (n, lb), v in m.items() if "xid" in n}
    assert value(m, "gpuwatchd_gpu_xid_errors_total", uuid=uuid, xid="13") == 1, (xids, d.log()[-4000:])
    assert interrupt(d) == 0


def test_egpu_unplug_kernel_log_and_nvml_agree(sim: list[DaemonProcess], tmp_path: Path) -> None:
    d = start_sim(sim, tmp_path, "--scenario", "egpu-unplug", "--speed", "10")
    uuid = "GPU-3a1e07c5-9c0f-4b7e-8d1a-e6b3090e6b30"
    m = metrics_when(d, lambda m: value(m, "gpuwatchd_gpu_fallen_off_bus_total", uuid=uuid) == 1, "the kernel's fall")
    assert value(m, "gpuwatchd_gpu_xid_errors_total", uuid=uuid, xid="79") == 1
    assert value(m, "gpuwatchd_gpu_xid_reports_total", uuid=uuid, xid="79", source="kmsg") == 1
    assert value(m, "gpuwatchd_pcie_aer_errors_total", uuid=uuid, severity="corrected") == 1  # on its TB root port
    assert value(m, "gpuwatchd_kernel_log_lines_total", kind="thunderbolt") == 1
    assert value(m, "gpuwatchd_kernel_log_lines_total", kind="pciehp") == 1
    m = metrics_when(d, lambda m: value(m, "gpuwatchd_gpu_present", uuid=uuid) == 0, "the eGPU gone")
    # NVML's own report of the Xid may or may not beat the loss (tests/notify/test_scenarios.py says why); either way
    # the Xid is counted once
    # The re-plug reaches NVML (a poll) and the kernel log (the ring's reader) at the same scenario time, read by two
    # sources on their own schedules: wait for both, then check nothing was counted twice.
    m = metrics_when(d, lambda m: value(m, "gpuwatchd_gpu_present", uuid=uuid) == 1
                     and (value(m, "gpuwatchd_kernel_log_lines_total", kind="thunderbolt") or 0) >= 2,
                     "the eGPU back, in NVML and in the kernel log")
    assert value(m, "gpuwatchd_kernel_log_lines_total", kind="thunderbolt") == 2
    assert value(m, "gpuwatchd_gpu_xid_errors_total", uuid=uuid, xid="79") == 1
    assert value(m, "gpuwatchd_gpu_fallen_off_bus_total", uuid=uuid) == 1
    assert interrupt(d) == 0
