"""Families of the torch health probes (docs/probes.md), from the probe ledger in the store.

Nothing is exported for a GPU before its first run. ``gpuwatchd_probe_available`` is exported from the start, with
or without GPUs and whether or not the driver answers: the daemon finds out as it starts (torch looked up, its
``version.py`` read for a CUDA build, and only for a CUDA build a one-shot worker asked whether CUDA works, a few
seconds); before that answer it is absent, never a guessed 0.
"""

from __future__ import annotations

from prometheus_client.core import Metric

from gpuwatchd.exporter.families import Families, spec
from gpuwatchd.model.probes import FAILED
from gpuwatchd.store import Store

AVAILABLE = spec("gpuwatchd_probe_available", "gauge",
                 "1 if torch health probes can run on this host, 0 if not (see gpuwatchd_probe_unavailable_info).")
UNAVAILABLE = spec("gpuwatchd_probe_unavailable_info", "info",
                   "Why probes cannot run: torch_not_installed, torch_without_cuda, driver_too_old, no_cuda_device, "
                   "check_failed, disabled.", ("reason",))
RUNS = spec("gpuwatchd_probe_runs_total", "counter",
            "Probe runs by result: pass, degraded, fail, error, crash, timeout, oom, cancelled "
            "(probe=\"worker\" for a whole-run crash or timeout).", ("uuid", "probe", "result"))
SKIPPED = spec("gpuwatchd_probe_skipped_total", "counter",
               "Due probe runs not run or cut short: busy_process, busy_utilization, duty_cycle, unavailable, oom, "
               "preempted (a job started mid-probe), gpu_lost, gpu_not_present.", ("uuid", "reason"))
LAST_RUN = spec("gpuwatchd_probe_last_run_timestamp_seconds", "gauge",
                "End of the probe's last run (unix seconds).", ("uuid", "probe"), unit="seconds")
SUCCESS = spec("gpuwatchd_probe_success", "gauge",
               "1 if the probe's last run found nothing wrong (degraded counts as success), 0 if it failed.",
               ("uuid", "probe"))
DURATION = spec("gpuwatchd_probe_duration_seconds", "gauge",
                "Wall time of the probe's last run (the whole worker for probe=\"worker\").", ("uuid", "probe"),
                unit="seconds")
FLOPS = spec("gpuwatchd_probe_flops", "gauge", "GEMM floating point operations per second in the last run.",
             ("uuid", "dtype"))
BANDWIDTH = spec("gpuwatchd_probe_bandwidth_bytes_per_second", "gauge",
                 "Copy bandwidth in the last run: d2d (memory probe), h2d and d2h (pinned, pcie probe).",
                 ("uuid", "direction"))
LATENCY = spec("gpuwatchd_probe_launch_latency_seconds", "gauge",
               "Median kernel launch + synchronize latency in the last run.", ("uuid",), unit="seconds")
RATIO = spec("gpuwatchd_probe_baseline_ratio", "gauge",
             "Last measure as a share of the GPU's own baseline (below 1 is worse, latency inverted).",
             ("uuid", "probe", "measure"))
ERRORS = spec("gpuwatchd_probe_errors", "gauge",
              "Mismatching elements (gemm) or words (memory) in the probe's last run.", ("uuid", "probe"))
RESETS = spec("gpuwatchd_probe_baseline_resets_total", "counter",
              "Times the baseline file was unreadable or corrupt and the baselines were rebuilt.")

_DIRECTION = {"memory.d2d": "d2d", "pcie.h2d": "h2d", "pcie.d2h": "d2h"}


def probe_families(store: Store) -> list[Metric]:
    led = store.probes
    f = Families()
    if led.available is not None:
        f.add(AVAILABLE, (), led.available)
        if not led.available:
            f.info(UNAVAILABLE, {"reason": led.unavailable_reason or "unknown"})
        f.add(RESETS, (), led.baseline_resets)
    for (uuid, probe, result), n in sorted(led.runs.items()):
        f.add(RUNS, (uuid, probe, result), n)
    for (uuid, reason), n in sorted(led.skipped.items()):
        f.add(SKIPPED, (uuid, reason), n)
    for (uuid, probe), rec in sorted(led.last.items()):
        f.add(LAST_RUN, (uuid, probe), rec.timestamp)
        f.add(SUCCESS, (uuid, probe), rec.result not in FAILED)
        f.add(DURATION, (uuid, probe), rec.duration_seconds)
        if probe in ("gemm", "memory"):
            f.add(ERRORS, (uuid, probe), rec.errors)
        for key, value in sorted(rec.measures.items()):
            if key.startswith("gemm.flops_"):
                f.add(FLOPS, (uuid, key.removeprefix("gemm.flops_")), value)
            elif key in _DIRECTION:
                f.add(BANDWIDTH, (uuid, _DIRECTION[key]), value)
            elif key == "launch.latency":
                f.add(LATENCY, (uuid,), value)
        for key, r in sorted(rec.ratios.items()):
            f.add(RATIO, (uuid, probe, key.split(".", 1)[1]), r)
    return f.metrics()
