"""What ``status`` and ``status --watch`` show for one status document: muted alerts as silenced/inhibited (not
``firing``), "N more" processes, the Thunderbolt tunnel, throttle reasons, health with its action; and that rich is
imported by the watch view alone (``gpuwatchd --help`` and the daemon never load it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from gpuwatchd.cli.status import alert_state, render_status
from gpuwatchd.cli.watch import fmt_rate, render_view

ROOT = Path(__file__).resolve().parents[2]
UUID = "GPU-3a1e07c5-9c0f-4b7e-8d1a-e6b3090e6b30"


def doc() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    procs = [{"pid": 100 + i, "name": "python", "user": "bob", "used_memory_bytes": (10 - i) * 2**30,
              "memory_trend": {"rate_bytes_per_second": 0.0, "history": [], "leak": None}} for i in range(10)]
    procs[0]["memory_trend"] = {"rate_bytes_per_second": 12 * 2**20, "history": [],
                                "leak": {"state": "firing", "eta_seconds": 1140.0}}
    status = {
        "daemon": {"version": "9.9", "host": "desk"},
        "nvml": {"ok": True, "driver_version": "550.1"},
        "gpus": [{
            "uuid": UUID, "index": 0, "name": "NVIDIA GeForce RTX 3090", "state": "present",
            "readings": {"memory_used_bytes": 20 * 2**30, "memory_total_bytes": 24 * 2**30,
                         "utilization_gpu_ratio": 0.97, "temperature_celsius": 83.0, "power_watts": 341.0,
                         "clocks_hz": {"sm": 1.2e9, "memory": 9.75e9}, "pstate": 2,
                         "clocks_event_reasons_active": ["sw_thermal", "gpu_idle"]},
            "link": {"current_generation": 3, "max_generation": 3, "current_width": 4, "max_width": 4},
            "dock": {"generation": 3, "rx_speed_bps": 20e9, "rx_lanes": 2, "authorized": True},
            "processes": procs, "processes_total": 256,
            "health": {"state": "degraded", "reason": "thermal throttling 40% of the last 10 min",
                       "action": "inspect_hardware", "action_text": "clean the enclosure's fan"},
            "probe": {"verdict": "pass"},
        }],
    }
    alerts = [
        {"labels": {"alertname": "GpuThrottled", "gpu": "0", "severity": "warning"}, "state": "firing",
         "annotations": {"summary": "GPU 0 throttled"},
         "status": {"state": "suppressed", "silencedBy": ["abc"], "inhibitedBy": []}},
        {"labels": {"alertname": "GpuMemoryLeak", "gpu": "0", "severity": "warning"}, "state": "firing",
         "annotations": {"summary": "python[100] grows"}, "status": {"state": "active", "silencedBy": [],
                                                                       "inhibitedBy": []}},
        {"labels": {"alertname": "GpuCountLow"}, "state": "firing", "annotations": {},
         "status": {"state": "suppressed", "silencedBy": [], "inhibitedBy": ["def"]}},
    ]
    return status, alerts


def text_of(renderable: Any) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_alert_state_says_silenced_and_inhibited() -> None:
    _, alerts = doc()
    assert [alert_state(a) for a in alerts] == ["silenced", "firing", "inhibited"]


def test_one_shot_status_says_silenced_and_how_many_more_processes() -> None:
    status, alerts = doc()
    out = render_status(status, alerts)
    throttled = next(line for line in out.splitlines() if line.startswith("GpuThrottled"))
    assert "silenced" in throttled and "firing" not in throttled
    assert "246 more processes (256 in all" in out


def test_watch_frame() -> None:
    status, alerts = doc()
    out = text_of(render_view(status, alerts, interval=2.0, now=0.0))
    lines = out.splitlines()
    gpu = next(line for line in lines if "RTX 3090" in line)
    for cell in ("degraded", "97%", "20.0/24.0 GiB", "83C", "341W", "1200/9750 MHz", "P2", "Gen3 x4 / Gen3 x4",
                 "sw_thermal", "pass"):
        assert cell in gpu, (cell, gpu)
    assert "gpu_idle" not in gpu  # not a throttle reason
    assert "TB3 2x20Gb/s" in out  # the Thunderbolt tunnel under the PCIe link
    assert "thermal throttling 40% of the last 10 min -> What to do: clean the enclosure's fan" in out
    leak_row = next(line for line in lines if " 100 " in line and "python" in line)
    assert "+720 MiB/min" in leak_row and "firing: full in 19m" in leak_row
    assert "GPU 0: 246 more processes" in out
    states = {line.split()[0]: line.split()[1] for line in lines if line.startswith("Gpu")}
    assert states == {"GpuThrottled": "silenced", "GpuMemoryLeak": "firing", "GpuCountLow": "inhibited"}


def test_watch_frame_when_the_daemon_does_not_answer() -> None:
    status, alerts = doc()
    out = text_of(render_view(status, alerts, interval=1.0, now=100.0, problem="connection refused", last_ok=70.0))
    assert "daemon not answering (last answer 30s ago), retrying: connection refused" in out
    assert "RTX 3090" in out  # the last picture stays


def test_fmt_rate() -> None:
    assert fmt_rate(2**20 / 60) == "+1 MiB/min" and fmt_rate(-(2**30) / 60) == "-1.0 GiB/min"
    assert fmt_rate(None) == "-"


def test_rich_is_loaded_by_the_watch_view_only() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from gpuwatchd.cli.commands import main\n"
        "import gpuwatchd.daemon, gpuwatchd.web.http\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['status', '--help'])\n"
        "print(sorted(m for m in sys.modules if m == 'rich' or m.startswith('rich.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]", out.stderr


def removal() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An eGPU pulled: NVML gave its index 0 to the internal GPU; the gone one is still listed, with its last index.
    The internal GPU runs a Slurm job step leaking memory (an alert about a job, not the GPU)."""
    status, _ = doc()
    gone = {**status["gpus"][0], "state": "removed", "readings": None, "processes": [], "processes_total": None,
            "health": {"state": "unhealthy", "reason": "GpuRemoved: the eGPU is gone", "action": "check_cable",
                       "action_text": "check the eGPU's cable", "evidence": ["GpuRemoved"]}}
    internal = {"uuid": "GPU-7d52", "index": 0, "name": "NVIDIA RTX A2000 12GB", "state": "present",
                "readings": {"memory_used_bytes": 2**30, "memory_total_bytes": 12 * 2**30},
                "processes": [{"pid": 7301, "name": "python", "user": "carol", "used_memory_bytes": 2**30,
                               "owner": {"container_id": "8d1e4b2a9f3c", "hpc_job": "4242"},
                               "memory_trend": {"rate_bytes_per_second": 2**20, "leak": None}},
                              {"pid": 7302, "name": "Xorg", "user": "root", "used_memory_bytes": 2**20,
                               "owner": None}],
                "health": {"state": "healthy", "reason": "no fault on the GPU itself", "action": "none",
                           "evidence": []}}
    status["gpus"] = [gone, internal]
    alerts = [{"labels": {"alertname": "GpuMemoryLeak", "uuid": "GPU-7d52", "gpu": "0", "severity": "warning"},
               "state": "firing", "annotations": {"summary": "python[7301] grows"}}]
    return status, alerts


def test_a_gone_gpu_is_was_gpu_n_and_a_jobs_alert_is_named_beside_healthy() -> None:
    status, alerts = removal()
    for name, out in (("status", render_status(status, alerts)),
                      ("watch", text_of(render_view(status, alerts, interval=2.0, now=0.0)))):
        lines = out.splitlines()
        # One row per GPU, and only the present one says 0.
        assert [line.split()[0] for line in lines if "RTX 3090" in line or "RTX A2000" in line] == ["was", "0"], out
        assert any(line.startswith("was GPU 0") and "GpuRemoved" in line for line in lines), (name, out)
        note = [line for line in lines if "not counted in the GPU's health" in line]
        assert len(note) == 1 and note[0].startswith("GPU 0: ") and note[0].endswith("GpuMemoryLeak"), (name, out)
        row = next(line for line in lines if " 7301 " in f" {line} ")
        assert "container 8d1e4b2a9f3c job 4242" in row, (name, row)  # the OWNER column, in both views
        host = next(line for line in lines if " 7302 " in f" {line} ").split()
        assert host[-1 if name == "status" else 4] == "-", (name, host)  # a host process has no owner
    header = next(line for line in text_of(render_view(status, alerts, interval=2.0, now=0.0)).splitlines()
                  if "PID" in line)
    assert header.split() == ["GPU", "PID", "USER", "PROCESS", "OWNER", "GPU", "MEMORY", "TREND", "LEAK"]
def test_status_shows_the_daemons_advice_and_never_a_catalog_code() -> None:
    status, alerts = doc()
    cat = {"mnemonic": "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "immediate_action": "RESTART_BM",
           "investigatory_action": "CONTACT_SUPPORT", "severity": "critical"}
    status["xid_counts"] = [{"uuid": UUID, "xid": 79, "count": 1, "catalog": cat, "action": "Re-plug the dock."},
                            {"uuid": UUID, "xid": 13, "count": 2, "catalog": dict(cat, immediate_action="RESTART_APP",
                                                                                  investigatory_action="")}]
    alerts.append({"labels": {"alertname": "GpuRemoved", "gpu": "0"}, "state": "firing",
                   "annotations": {"summary": "gone", "action": "Re-plug the dock."},
                   "status": {"state": "active", "silencedBy": [], "inhibitedBy": []}})
    out = render_status(status, alerts)
    row79 = next(line for line in out.splitlines() if line.startswith("0    79"))
    assert row79.endswith("Re-plug the dock.")
    # A daemon from before the advice was in the status: the code's words, not its bucket.
    row13 = next(line for line in out.splitlines() if line.startswith("0    13"))
    assert "Restart the application" in row13
    assert "RESTART_BM" not in out and "RESTART_APP" not in out and "CONTACT_SUPPORT" not in out
    assert "What to do about GpuRemoved (GPU 0): Re-plug the dock." in out
    assert "What to do: clean the enclosure's fan" in out  # the GPU's health advice
    # Muted alerts' advice is not repeated (the GPU's own advice speaks for it).
    assert "What to do about GpuThrottled" not in out
    frame = text_of(render_view(status, alerts, interval=2.0, now=0.0))
    assert "What to do about GpuRemoved (GPU 0): Re-plug the dock." in frame
