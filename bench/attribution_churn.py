"""Series count under pod churn: a GPU node whose pods run thousands of short jobs, each in a new container of a
new pod, with attribution on (owner labels on per-process series, gpuwatchd_gpu_pod_info).

    python bench/attribution_churn.py [--gpus 8] [--jobs 3000] [--per-gpu 4] [--life 20] [--top-n 10]

Real parts: the Store, the attribution source (cgroups read from a fake /proc, the kubelet's pod-resources List
answered by a real gRPC server on a unix socket, asked every ``--interval`` polls) and the store collector, scraped
every 15 polls (a 15 s scrape at 1 s polls) and parsed like Prometheus. Each GPU keeps ``--per-gpu`` jobs running;
every job lives ``--life`` polls, then its pod is replaced by a new one (new pid, container id, pod name).

What must stay bounded is what one scrape exposes (Prometheus' head series at any moment, and the daemon's
memory): top-N per-process series per GPU and one pod_info per pod holding a GPU now, however many jobs went
by. The number of distinct series over the whole run grows with the jobs by nature (a new pid is a new series,
with or without attribution); Prometheus drops them after its staleness window.

Last line: ``max_scrape_series=… max_process_series=… max_pod_info=… distinct_series=… jobs=… cache_max=…``
(targets: max_process_series <= gpus x top_n x 2 (memory + host RSS), max_pod_info <= gpus x per_gpu, cache_max
<= gpus x per_gpu x 2).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpuwatchd.config.attribution import AttributionConfig  # noqa: E402
from gpuwatchd.config.types import validate  # noqa: E402
from gpuwatchd.exporter.collector import StoreCollector  # noqa: E402
from gpuwatchd.model import GpuSample, ProcessSample, Snapshot  # noqa: E402
from gpuwatchd.sources.attribution.task import AttributionTask  # noqa: E402
from gpuwatchd.store import Store  # noqa: E402
from tests.sources.attribution.kubelet_server import serve  # noqa: E402

CGROUP = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
          "cri-containerd-{cid}.scope\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--per-gpu", type=int, default=4)
    ap.add_argument("--life", type=int, default=20, help="polls a job lives")
    ap.add_argument("--top-n", type=int, default=10)
    ap.add_argument("--interval", type=int, default=10, help="polls between kubelet List calls")
    a = ap.parse_args()
    asyncio.run(run(a))


async def run(a: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpuwatchd-churn-"))
    proc = tmp / "proc"
    uuids = [f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in range(a.gpus)]
    cfg = validate(AttributionConfig, {"proc_root": str(proc), "host_root": str(tmp / "host"),
                                            "kubernetes": {"pod_resources_socket": str(tmp / "k.sock")}})
    task = AttributionTask(cfg)
    store = Store()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(store))
    running: dict[int, list[tuple[int, int]]] = {g: [] for g in range(a.gpus)}  # gpu -> [(job, born)]
    started = 0
    max_series = max_proc = max_pod = cache_max = waiting = 0
    distinct: set[tuple[str, tuple[tuple[str, str], ...]]] = set()

    def answer() -> dict:
        return {("jobs", f"job-{j}"): {"worker": [("nvidia.com/gpu", [uuids[g]])]}
                for g, js in running.items() for j, _ in js}

    with serve(tmp / "k.sock", {}) as kubelet:
        t = 0
        while started < a.jobs or any(running.values()):
            t += 1
            for g in range(a.gpus):
                running[g] = [(j, b) for j, b in running[g] if t - b < a.life]
                while len(running[g]) < a.per_gpu and started < a.jobs:
                    j = started
                    started += 1
                    pid = 10_000 + j
                    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
                    (proc / str(pid) / "cgroup").write_text(
                        CGROUP.format(uid=f"{j:08x}_0000_4000_8000_000000000000", cid=f"{j:064x}"))
                    # stagger lives so jobs end at different polls
                    running[g].append((j, t - (j % a.life) if t == 1 else t))
            if t % a.interval == 1:
                kubelet.pods = answer()
                await task.refresh()
            gpus = tuple(
                GpuSample(uuid=uuids[g], index=g, processes_total=len(js) + 2, processes=tuple(
                    ProcessSample(pid=10_000 + j, name="python", used_memory_bytes=(j % 97 + 1) << 24,
                                  host_rss_bytes=1 << 30) for j, _ in js)[: a.top_n])
                for g, js in running.items())
            snap = Snapshot(timestamp=float(t), nvml_ok=True, gpus=gpus)
            store.apply(snap)
            store.set_attribution(task.resolve(snap, now=float(t)))
            cache_max = max(cache_max, len(task._cgroups))
            if t % 15 == 0:
                text = generate_latest(reg).decode()
                samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
                max_series = max(max_series, len(samples))
                proc_series = [s for s in samples if s.name.startswith("gpuwatchd_gpu_process_")]
                max_proc = max(max_proc, len(proc_series))
                max_pod = max(max_pod, sum(s.name == "gpuwatchd_gpu_pod_info" for s in samples))
                distinct.update((s.name, tuple(sorted(s.labels.items()))) for s in proc_series)
                # a job younger than one kubelet interval has its container_id but not yet its pod
                waiting = max(waiting, sum(not s.labels.get("pod") for s in proc_series))
            # finished jobs' /proc entries go, as a real exit does
            live = {10_000 + j for js in running.values() for j, _ in js}
            for p in list(proc.iterdir()):
                if int(p.name) not in live:
                    (p / "cgroup").unlink()
                    p.rmdir()
    print(f"gpus={a.gpus} per_gpu={a.per_gpu} top_n={a.top_n} polls={t} "
          f"max_process_series_waiting_for_pod={waiting}")
    print(f"max_scrape_series={max_series} max_process_series={max_proc} max_pod_info={max_pod} "
          f"distinct_series={len(distinct)} jobs={started} cache_max={cache_max}")


if __name__ == "__main__":
    main()
