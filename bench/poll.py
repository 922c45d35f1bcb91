"""NVML worker CPU time per poll vs a bare pynvml loop making the same calls, against the same stand-in state.

    python bench/poll.py [--quick] [--interval 1 --sizes 8x32 --pairs 3]

Both run as child processes with the stand-in on LD_LIBRARY_PATH. Each child measures its own CPU time
(``time.process_time()``, CLOCK_PROCESS_CPUTIME_ID: precise, unlike tick-granular rusage) over the steady-state
poll loop after WARMUP polls, so interpreter start-up, imports and init are not in the figure. The worker is the
real one run as the daemon runs it (its ``measure_after`` option reports the figure). Worker and bare children run
interleaved, PAIRS pairs per size; the figure is the median of the per-pair ratios, with min/max to show the noise.
Before measuring, both are traced (the worker's ``trace_calls``) to check they make the same pynvml calls per poll.
Target: poll_ratio <= 1.3 (the worker's CPU time per poll at most 30% above the bare loop's). The last line holds
the figures as name=value pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from footprint import fleet_state  # noqa: E402

from gpuwatchd.sim.build import build_standin  # noqa: E402
from gpuwatchd.sim.gpm_state import GPM_METRICS  # noqa: E402
from gpuwatchd.sim.standin_abi import STATE_ENV  # noqa: E402
from gpuwatchd.sim.state import make_state, write_state  # noqa: E402
from gpuwatchd.sim.worker import WORKER_MODULE  # noqa: E402  (process names from the sim state: pids are fictitious)

SIZES = [(8, 32, 1000), (16, 256, 150)]  # GPUs, processes per GPU, polls measured per child
WARMUP = 20  # polls before measuring: imports, first-poll capability learning, buffers grown, caches warm
WARMUP_APART = 5  # the same with --interval: the first polls learn what is absent; caches stay cold anyway
PAIRS = 7  # worker/bare children run interleaved (ABAB...) so machine-load drift hits both alike
TOP_N = 10  # the daemon's default processes.top_n
# An H100 SXM's 18 NVLinks, all up with counters: both loops read every link's state and put the per-link field
# ids (throughput tx/rx, and the four error counters on links 0-11) in the one field-values call.
NVLINKS = 18
MEASURED = re.compile(r"measured cpu_seconds=(?P<cpu>[0-9.]+) polls=(?P<polls>\d+)")

# The bare loop: exactly the pynvml calls the worker makes per poll (static facts once, at start), no bookkeeping.
BARE = r'''
import json, sys
import pynvml as N
import time
opts = json.loads(sys.argv[1])
counts = {}
if opts.get("trace_calls"):
    # same counting as the worker's trace_calls: one per symbol look-up, i.e. per pynvml call
    orig = N._nvmlGetFunctionPointer
    def lookup(name):
        counts[name] = counts.get(name, 0) + 1
        return orig(name)
    N._nvmlGetFunctionPointer = lookup
N.nvmlInitWithFlags(N.NVML_INIT_FLAG_NO_GPUS)
N.nvmlSystemGetDriverVersion(); N.nvmlSystemGetNVMLVersion(); N.nvmlSystemGetCudaDriverVersion()
hs = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
for h in hs:
    N.nvmlDeviceGetUUID(h); N.nvmlDeviceGetName(h); N.nvmlDeviceGetPciInfo(h); N.nvmlDeviceGetSerial(h)
es = N.nvmlEventSetCreate()
for h in hs:
    N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError & N.nvmlDeviceGetSupportedEventTypes(h), es)
E = N.NVMLError
CLK = (N.NVML_CLOCK_GRAPHICS, N.NVML_CLOCK_SM, N.NVML_CLOCK_MEM, N.NVML_CLOCK_VIDEO)
POL = (0, 1, 2, 3, 4, 5, 10, 11)
def fans(h):
    for i in range(N.nvmlDeviceGetNumFans(h)):
        N.nvmlDeviceGetFanSpeed_v2(h, i)
def device_calls(h):
    c = [(N.nvmlDeviceGetMemoryInfo, (h, N.nvmlMemory_v2)), (N.nvmlDeviceGetUtilizationRates, (h,)),
         (N.nvmlDeviceGetPerformanceState, (h,)), (N.nvmlDeviceGetTemperatureV, (h, 0))]
    c += [(N.nvmlDeviceGetTemperatureThreshold, (h, t)) for t in (1, 0, 3, 2)]
    c += [(fans, (h,)), (N.nvmlDeviceGetPowerUsage, (h,)), (N.nvmlDeviceGetEnforcedPowerLimit, (h,)),
          (N.nvmlDeviceGetPowerManagementLimitConstraints, (h,)), (N.nvmlDeviceGetPowerManagementDefaultLimit, (h,)),
          (N.nvmlDeviceGetEncoderUtilization, (h,)), (N.nvmlDeviceGetDecoderUtilization, (h,)),
          (N.nvmlDeviceGetEncoderStats, (h,)), (N.nvmlDeviceGetFieldValues, (h, field_ids(opts["nvlinks"]))),
          (N.nvmlDeviceGetTotalEnergyConsumption, (h,))]
    for k in CLK:
        c += [(N.nvmlDeviceGetClockInfo, (h, k)), (N.nvmlDeviceGetMaxClockInfo, (h, k))]
    c += [(N.nvmlDeviceGetCurrentClocksEventReasons, (h,)), (N.nvmlDeviceGetSupportedClocksEventReasons, (h,))]
    c += [(N.nvmlDeviceGetViolationStatus, (h, p)) for p in POL]
    c += [(N.nvmlDeviceGetEccMode, (h,))]
    c += [(N.nvmlDeviceGetTotalEccErrors, (h, t, k)) for t in (0, 1) for k in (0, 1)]
    c += [(N.nvmlDeviceGetRetiredPages, (h, 0)), (N.nvmlDeviceGetRetiredPages, (h, 1)),
          (N.nvmlDeviceGetRetiredPagesPendingStatus, (h,)), (N.nvmlDeviceGetRemappedRows, (h,)),
          (N.nvmlDeviceGetCurrPcieLinkGeneration, (h,)), (N.nvmlDeviceGetMaxPcieLinkGeneration, (h,)),
          (N.nvmlDeviceGetCurrPcieLinkWidth, (h,)), (N.nvmlDeviceGetMaxPcieLinkWidth, (h,)),
          (N.nvmlDeviceGetPcieThroughput, (h, 0)), (N.nvmlDeviceGetPcieThroughput, (h, 1)),
          (N.nvmlDeviceGetPcieReplayCounter, (h,))]
    c += [(N.nvmlDeviceGetNvLinkState, (h, link)) for link in range(opts["nvlinks"])]
    c += [(N.nvmlDeviceGetMigMode, (h,)), (N.nvmlDeviceGetComputeRunningProcesses_v3, (h,)),
          (N.nvmlDeviceGetGraphicsRunningProcesses_v3, (h,)), (process_utilization, (h,))]
    return c
last_seen = {}
def process_utilization(h):
    # nvml.h: ask for the samples since the newest one seen (NOT_FOUND: none since), as the worker does
    key = id(h)
    try:
        samples = N.nvmlDeviceGetProcessesUtilizationInfo(h, last_seen.get(key, 0))
    except E as e:
        if e.value != N.NVML_ERROR_NOT_FOUND:
            raise
        return
    if samples:
        last_seen[key] = max(s.timeStamp for s in samples)
def field_ids(links):
    # memory temp, PCIe rollover/correctable/non-fatal/fatal, recovery action; per link: NVLink data tx/rx
    # (scopeId = link) and the CRC flit/CRC data/replay/recovery _L<n> ids (links 0-11): nvml.h's numbers
    ids = [82, 95, 173, 179, 180, 230]
    for link in range(links):
        ids += [(138, link), (139, link)]
        if link < 12:
            for l0, l6 in ((32, 96), (39, 102), (46, 108), (53, 114)):
                ids.append((l0 + link if link < 6 else l6 + link - 6, link))
    return ids
ABSENT = (N.NVML_ERROR_NOT_SUPPORTED, N.NVML_ERROR_FUNCTION_NOT_FOUND)
def supported(calls):
    # what a hand-written loop for this device would call: drop what the device answers absent (as the worker does)
    keep = []
    for fn, a in calls:
        try:
            r = fn(*a)
        except E as e:
            if e.value in ABSENT:
                continue
        else:
            # field values: the worker stops asking ids answered NOT_SUPPORTED, and the call when none is left
            if fn is N.nvmlDeviceGetFieldValues and all(v.nvmlReturn in ABSENT for v in r):
                continue
        keep.append((fn, a))
    return keep
mig_gis = {}  # id(GPU handle) -> GPU instance ids of its MIG devices
GPU_PROCESS_CALLS = (N.nvmlDeviceGetComputeRunningProcesses_v3, N.nvmlDeviceGetGraphicsRunningProcesses_v3,
                     process_utilization)
def mig_calls(h):
    # MIG devices as the worker reads them (sources/nvml/worker/mig.py): opened once; per poll each one's memory and
    # processes (the GPU's own process lists are their aggregate, so not read), and each empty slot probed
    try:
        if N.nvmlDeviceGetMigMode(h)[0] != N.NVML_DEVICE_MIG_ENABLE:
            return [], 0
    except E:
        return [], 0
    c, n, empty = [], 0, []
    for i in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except E:
            empty.append(i)
            continue
        N.nvmlDeviceGetUUID(m); N.nvmlDeviceGetName(m)
        mig_gis.setdefault(id(h), []).append(N.nvmlDeviceGetGpuInstanceId(m)); N.nvmlDeviceGetComputeInstanceId(m)
        n += 1
        c += supported([(N.nvmlDeviceGetMemoryInfo, (m, N.nvmlMemory_v2)),
                        (N.nvmlDeviceGetComputeRunningProcesses_v3, (m,)),
                        (N.nvmlDeviceGetGraphicsRunningProcesses_v3, (m,)), (process_utilization, (m,))])
    if empty:  # one empty slot probed a poll, in turn, for a new MIG device
        c.append((probe_next, (h, empty, [0])))
    return c, n
def probe_next(h, empty, turn):
    i = empty[turn[0] % len(empty)]
    turn[0] += 1
    N.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
# a board's constants (the worker's readings.STATIC_READINGS): read once at start, by supported() below, as the worker
# reads them when it opens a GPU (and again a minute later, beyond what this loop measures)
STATIC = (N.nvmlDeviceGetTemperatureThreshold, N.nvmlDeviceGetPowerManagementLimitConstraints,
          N.nvmlDeviceGetPowerManagementDefaultLimit, N.nvmlDeviceGetMaxClockInfo,
          N.nvmlDeviceGetSupportedClocksEventReasons, N.nvmlDeviceGetMaxPcieLinkGeneration,
          N.nvmlDeviceGetMaxPcieLinkWidth)
calls = []
for h in hs:
    mc, n_mig = mig_calls(h)
    dc = [x for x in device_calls(h) if not n_mig or x[0] not in GPU_PROCESS_CALLS]
    calls.append([x for x in supported(dc) if x[0] not in STATIC] + mc)
GPM_IDS = [getattr(N, "NVML_GPM_METRIC_" + k) for k in (
    "GRAPHICS_UTIL", "SM_UTIL", "SM_OCCUPANCY", "ANY_TENSOR_UTIL", "HMMA_TENSOR_UTIL", "IMMA_TENSOR_UTIL",
    "DFMA_TENSOR_UTIL", "DMMA_TENSOR_UTIL", "DRAM_BW_UTIL", "FP64_UTIL", "FP32_UTIL", "FP16_UTIL", "INTEGER_UTIL",
    "PCIE_TX_PER_SEC", "PCIE_RX_PER_SEC", "NVLINK_TOTAL_TX_PER_SEC", "NVLINK_TOTAL_RX_PER_SEC")]
class Gpm:
    # GPM as nvml.h prescribes: two sample buffers, a sample per poll, the metrics from the last two samples
    def __init__(self, h, gi=None):
        # gi: a GPU instance of h (a MIG device's GPM, nvmlGpmMigSampleGet, as sources/nvml/worker/mig.py reads it)
        self.h, self.buf, self.cur, self.paired = h, [N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()], 0, False
        self.gi = gi
        self.get = N.c_nvmlGpmMetricsGet_t()
        self.get.version, self.get.numMetrics = N.NVML_GPM_METRICS_GET_VERSION, len(GPM_IDS)
        for i, m in enumerate(GPM_IDS):
            self.get.metrics[i].metricId = m
    def __call__(self):
        sample, previous = self.buf[self.cur], self.buf[self.cur ^ 1]
        if self.gi is None:
            N.nvmlGpmSampleGet(self.h, sample)
        else:
            N.nvmlGpmMigSampleGet(self.h, self.gi, sample)
        self.cur ^= 1
        if self.paired:
            self.get.sample1, self.get.sample2 = previous, sample
            N.nvmlGpmMetricsGet(self.get)
            ms = self.get.metrics
            [ms[i].value for i in range(len(GPM_IDS)) if ms[i].nvmlReturn == 0]
        self.paired = True
gpms = [Gpm(h) for h in hs if N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice]
gpms += [Gpm(h, gi) for h in hs if N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice for gi in mig_gis.get(id(h), ())]
cpu0 = 0.0
for poll in range(opts["max_polls"]):
    if poll == opts["measure_after"]:
        cpu0 = time.process_time()
    counts.clear()
    for dc in calls:
        for fn, a in dc:
            try:
                fn(*a)
            except E:
                pass
    for g in gpms:
        g()
    try:
        N.nvmlEventSetWait_v2(es, 0)
    except E:
        pass
    N.nvmlDeviceGetCount()
    if opts.get("interval"):
        time.sleep(opts["interval"])
cpu = time.process_time() - cpu0
print(json.dumps({"cpu_seconds": cpu, "polls": opts["max_polls"] - opts["measure_after"], "calls": counts}))
'''


def bench_state(gpus: int, procs: int) -> dict[str, Any]:
    state = make_state(gpus)
    for g, dev in enumerate(state["devices"]):
        dev["processes"] = {
            "compute": [{"pid": 10_000 + g * 1000 + i, "used_memory": (i + 1) << 20, "name": f"train{i}",
                         "user": "alice", "host_rss": 1 << 30} for i in range(procs)],
            "graphics": [],
        }
        # the media engines and the default limit are read too (a board that has them)
        dev.update(encoder_utilization=10 + g, decoder_utilization=20 + g, power_default_limit_mw=300000,
                   field_values={"memory_temp": 60, "pcie_replay_rollover": 0, "pcie_correctable_errors": 3,
                                 "pcie_non_fatal_errors": 0, "pcie_fatal_errors": 0},
                   encoder_stats={"session_count": 1, "average_fps": 30, "average_latency_us": 800},
                   nvlink=[1] * NVLINKS, recovery_action=0,
                   nvlink_counters=[{"tx_kib": 10**9 + i, "rx_kib": 10**9 + 2 * i, "crc_flit": i, "crc_data": 0,
                                     "replay": 0, "recovery": 0} for i in range(NVLINKS)],
                   # per-process utilization: a sample per process (each had some SM time in the period)
                   process_utilization=[{"pid": p["pid"], "timestamp_us": 1_700_000_000_000_000, "sm": 5 + i % 90,
                                         "memory": 1 + i % 50} for i, p in enumerate(dev["processes"]["compute"])])
        # GPM (a Hopper board): every metric the worker asks for is served, so both sides compute all of them
        dev["gpm"] = {**{k: 10.0 + g for k, _ in GPM_METRICS if not k.endswith("_per_sec")},
                      **{k: 1000.0 * (g + 1) for k, _ in GPM_METRICS if k.endswith("_per_sec")}}
    # GPU 0 in MIG mode (sources/nvml/worker/mig.py): its processes run in two MIG devices, read per MIG device
    gpu0 = state["devices"][0]
    half = len(gpu0["processes"]["compute"]) // 2
    gpu0.update(name="NVIDIA A100-SXM4-80GB", mig_mode=[1, 1],
                memory={"total": 80 << 30, "reserved": 0, "used": 1 << 30},
                mig_devices=[
                    {"index": 0, "uuid": "MIG-00000000-0000-5000-8000-000000000000", "profile": "3g.40gb",
                     "gpu_instance_id": 2, "memory": {"total": 40 << 30, "used": 1 << 30},
                     "processes": {"compute": gpu0["processes"]["compute"][:half]}},
                    {"index": 2, "uuid": "MIG-00000000-0000-5000-8000-000000000002", "profile": "1g.10gb",
                     "gpu_instance_id": 9, "memory": {"total": 10 << 30, "used": 1 << 30},
                     "processes": {"compute": gpu0["processes"]["compute"][half:]}}],
                processes={"compute": [], "graphics": []})
    # and GPM per GPU instance: every metric served, so both sides compute all of them for each MIG device too
    gpu0["gpm"]["instances"] = {str(gi): dict.fromkeys((k for k, _ in GPM_METRICS), value)
                                for gi, value in ((2, 5.0), (9, 2.0))}
    return state


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{argv[1:3]} failed ({r.returncode}): {r.stderr[-2000:]}")
    return r


def worker_per_poll(env: dict[str, str], polls: int, interval: float = 0.0) -> float:
    """CPU seconds per steady-state poll, measured by the worker itself (``measure_after``), run as the daemon
    runs it: same poll, JSON line to a pipe, resolver, event drain."""
    warmup = WARMUP_APART if interval else WARMUP
    opts = {"interval": interval, "top_n": TOP_N, "max_polls": warmup + polls, "measure_after": warmup}
    r = _run([sys.executable, "-m", WORKER_MODULE, json.dumps(opts)], env)
    m = MEASURED.search(r.stderr)
    if m is None:
        raise SystemExit(f"worker printed no measurement: {r.stderr[-2000:]}")
    return float(m["cpu"]) / int(m["polls"])


def bare_per_poll(env: dict[str, str], polls: int, interval: float = 0.0) -> float:
    warmup = WARMUP_APART if interval else WARMUP
    opts = {"max_polls": warmup + polls, "measure_after": warmup, "nvlinks": NVLINKS, "interval": interval}
    r = _run([sys.executable, "-c", BARE, json.dumps(opts)], env)
    out = json.loads(r.stdout.splitlines()[-1])
    return float(out["cpu_seconds"]) / int(out["polls"])


def call_diff(env: dict[str, str]) -> dict[str, tuple[int, int]]:
    """NVML symbol look-ups in one steady-state poll, worker vs bare: {symbol: (worker, bare)} where they differ.

    Both count pynvml's ``_nvmlGetFunctionPointer`` (one per pynvml call; the worker's process lister looks its
    symbol up the same way). The worker's process lister then makes one C call where pynvml's wrapper makes two
    (size, then data), so at equal counts the worker does no more driver work than the bare loop.
    """
    polls = 3
    opts = {"interval": 0.0, "top_n": TOP_N, "max_polls": polls, "trace_calls": True}
    r = _run([sys.executable, "-m", WORKER_MODULE, json.dumps(opts)], env)
    worker: dict[str, int] = json.loads(r.stdout.splitlines()[-1])["calls"]
    r = _run([sys.executable, "-c", BARE,
              json.dumps({"max_polls": polls, "measure_after": 0, "trace_calls": True, "nvlinks": NVLINKS})], env)
    bare: dict[str, int] = json.loads(r.stdout.splitlines()[-1])["calls"]
    return {k: (worker.get(k, 0), bare.get(k, 0)) for k in sorted(set(worker) | set(bare))
            if worker.get(k, 0) != bare.get(k, 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer polls and 2 pairs")
    ap.add_argument("--interval", type=float, default=0.0,
                    help="seconds between polls in both children (default 0: back to back). At 1, the daemon's "
                         "default, each poll runs on cold caches, as it does in the daemon; the bare loop at that "
                         "interval is the floor of any pynvml poller making these calls")
    ap.add_argument("--polls", type=int, help="polls measured per child (default: per size; 20 with --interval)")
    ap.add_argument("--pairs", type=int, help=f"worker/bare pairs per size (default {PAIRS}; 2 with --quick)")
    ap.add_argument("--fleet", choices=("full", "footprint"), default="full",
                    help="full: every reading (18 NVLinks, MIG, GPM); footprint: bench/footprint.py's fleet (PCIe "
                         "GPUs without NVLink, MIG or GPM), to set beside its figures")
    ap.add_argument("--sizes", default=",".join(f"{g}x{p}" for g, p, _ in SIZES),
                    help="GPUs x processes, comma-separated (default: %(default)s)")
    args = ap.parse_args()
    quick, interval = args.quick, args.interval
    wanted = args.sizes.split(",")
    sizes = [(g, p, n) for g, p, n in SIZES if f"{g}x{p}" in wanted]
    sizes += [(int(w.split("x")[0]), int(w.split("x")[1]), 150) for w in wanted
              if w not in {f"{g}x{p}" for g, p, _ in SIZES}]
    libdir = build_standin()
    figures: dict[str, float] = {}
    worst = []
    with tempfile.TemporaryDirectory() as tmp:
        for gpus, procs, polls in sizes:
            tag = f"{gpus}x{procs}"
            state_path = Path(tmp) / f"state-{tag}"
            write_state(state_path, fleet_state(gpus, procs) if args.fleet == "footprint" else bench_state(gpus, procs))
            env = {**os.environ, "LD_LIBRARY_PATH": str(libdir), STATE_ENV: str(state_path), "PYTHONPATH": str(ROOT)}
            diff = call_diff(env)
            if diff:
                raise SystemExit(f"{tag}: the bare loop does not make the worker's NVML calls "
                                 f"(symbol: (worker, bare)): {diff}")
            n = args.polls or (20 if interval else max(polls // 10, 5) if quick else polls)
            pairs = args.pairs or (2 if quick else PAIRS)
            ratios, workers, bares = [], [], []
            for _ in range(pairs):
                w = worker_per_poll(env, n, interval)
                b = bare_per_poll(env, n, interval)
                workers.append(w)
                bares.append(b)
                ratios.append(w / b)
            ratio = statistics.median(ratios)
            worst.append(ratio)
            figures[f"poll_ratio_{tag}"] = ratio
            figures[f"poll_ratio_{tag}_min"] = min(ratios)
            figures[f"poll_ratio_{tag}_max"] = max(ratios)
            figures[f"worker_ms_{tag}"] = statistics.median(workers) * 1000
            figures[f"bare_ms_{tag}"] = statistics.median(bares) * 1000
            print(f"{tag}: same NVML calls per poll (traced); worker {figures[f'worker_ms_{tag}']:.3f} ms/poll, "
                  f"bare pynvml {figures[f'bare_ms_{tag}']:.3f} ms/poll (medians); ratio median {ratio:.3f} "
                  f"[min {min(ratios):.3f}, max {max(ratios):.3f}] over {pairs} interleaved pairs of "
                  f"{n} polls after {WARMUP_APART if interval else WARMUP} warm-up, {interval:g} s apart", flush=True)
    head = {"poll_ratio": max(worst)}
    print(" ".join(f"{k}={v:.3f}" for k, v in {**head, **figures}.items()))


if __name__ == "__main__":
    main()
