"""The ``attribution`` scenario end to end: the stand-in driver with processes placed in each runtime's cgroups
(the sim's fake /proc), a real gRPC kubelet on a unix socket, the real NVML worker, store, rules engine and
dispatcher, real chat/webhook sinks. The exported labels, the status table and the leak message name the right
owner for every process, and nothing for host processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.cli.status import render_status
from gpuwatchd.config.attribution import AttributionConfig
from gpuwatchd.config.types import validate
from gpuwatchd.exporter.collector import StoreCollector
from gpuwatchd.sources.attribution.task import AttributionTask
from gpuwatchd.web.status import status_from_store
from tests.notify.scenario_harness import message_text
from tests.notify.scenario_replay import NvmlChild, Replay, replay
from tests.sources.attribution.kubelet_server import serve

G0 = "GPU-0a7c5d1e-1111-4c6d-8e9f-0a1b2c3d4e50"
G1 = "GPU-1b8d6e2f-2222-4c6d-8e9f-0a1b2c3d4e51"
G3 = "GPU-3dafa041-6666-4c6d-8e9f-0a1b2c3d4e53"
M_TRITON = "MIG-6d1f8a41-4444-5b3c-8d21-7e5f0a4b9c13"
M_DOCKER = "MIG-7e2f9b52-5555-5a61-9e0f-5d3a8b6c2e70"

KUBELET = {
    ("ml", "trainer-0"): {"trainer": [("nvidia.com/gpu", [G0])]},
    ("ml", "notebook-a"): {"jupyter": [("nvidia.com/gpu", [f"{G1}::0"])]},
    ("research", "notebook-b"): {"jupyter": [("nvidia.com/gpu", [f"{G1}::1"])]},
    ("infer", "server"): {"triton": [("nvidia.com/mig-3g.40gb", [M_TRITON])],
                          "metrics": [("example.com/nic", ["eth1"])]},
}
# pid -> the owner labels its per-process series must carry (exactly; {} = none)
OWNERS: dict[str, dict[str, str]] = {
    "4242": {"container_id": "8d1e4b2a9f3c", "namespace": "ml", "pod": "trainer-0", "container": "trainer"},
    "5101": {"container_id": "bbbbbbbbbbbb", "namespace": "research", "pod": "notebook-b", "container": "jupyter"},
    "5102": {"container_id": "aaaaaaaaaaaa"},  # shared GPU, no runtime files: the pod is not guessed
    "5103": {},  # host Xorg
    "6101": {"container_id": "cccccccccccc", "namespace": "infer", "pod": "server", "container": "triton"},
    "6202": {"container_id": "3f2a9c1b7d4e"},  # plain Docker
    "7301": {"hpc_job": "4242"},  # Slurm job step cgroup
    "7302": {},  # host process
}
OWNER_COLUMN = {
    "4242": "pod ml/trainer-0/trainer", "5101": "pod research/notebook-b/jupyter",
    "5102": "container aaaaaaaaaaaa", "5103": "-", "6101": "pod infer/server/triton",
    "6202": "container 3f2a9c1b7d4e", "7301": "job 4242", "7302": "-",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replay]:
    import asyncio

    from gpuwatchd.sim.build import build_standin

    tmp = tmp_path_factory.mktemp("attribution")
    host = tmp / "host"  # the container runtimes' files: only notebook-b's container has readable ones
    bundle = host / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / ("b" * 64)
    bundle.mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"annotations": {
        "io.kubernetes.cri.sandbox-namespace": "research", "io.kubernetes.cri.sandbox-name": "notebook-b",
        "io.kubernetes.cri.container-name": "jupyter", "io.kubernetes.cri.image-name": "jupyter/scipy:2024"}}))
    cfg = validate(AttributionConfig, {
        "proc_root": str(tmp / "sysfs" / "proc"), "host_root": str(host),
        "kubernetes": {"pod_resources_socket": str(tmp / "kubelet.sock"), "timeout": 10.0}})
    child = NvmlChild(build_standin())
    try:
        with serve(tmp / "kubelet.sock", KUBELET) as kubelet:
            result = asyncio.run(replay("attribution", child, tmp, step=10.0, tail=0.0, rules={},
                                        attribution=AttributionTask(cfg)))
            assert kubelet.calls == 1
    finally:
        child.close()
    yield result


def _series(r: Replay) -> list[tuple[str, dict[str, str], float]]:
    assert r.store is not None
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(r.store))
    text = generate_latest(reg).decode()
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def test_per_process_series_carry_their_owner_and_host_processes_none(run: Replay) -> None:
    assert run.store is not None
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(run.store))
    text = generate_latest(reg).decode()
    for label in ("container_id", "namespace", "pod", "container", "hpc_job"):
        assert f'{label}=""' not in text  # absent, not empty
    series = _series(run)
    mem = {s[1]["pid"]: s[1] for s in series if s[0] == "gpuwatchd_gpu_process_memory_used_bytes"}
    assert set(mem) == set(OWNERS)
    for pid, want in OWNERS.items():
        got = {k: v for k, v in mem[pid].items() if k not in ("uuid", "pid", "process")}
        assert got == want, pid  # absent, not empty, where unknown
    rss = {s[1]["pid"]: s[1] for s in series if s[0] == "gpuwatchd_gpu_process_host_rss_bytes"}
    assert rss == mem  # every per-process family carries the same labels


def test_gpu_pod_info_lists_every_pod_per_gpu_and_mig_instance(run: Replay) -> None:
    pods = {(s[1]["uuid"], s[1]["namespace"], s[1]["pod"], s[1]["container"])
            for s in _series(run) if s[0] == "gpuwatchd_gpu_pod_info"}
    assert pods == {(G0, "ml", "trainer-0", "trainer"), (G1, "ml", "notebook-a", "jupyter"),
                    (G1, "research", "notebook-b", "jupyter"), (M_TRITON, "infer", "server", "triton")}
    errors = {s[1]["source"]: s[2] for s in _series(run) if s[0] == "gpuwatchd_attribution_errors_total"}
    assert errors == {"cgroup": 0.0, "kubernetes": 0.0, "hpc_jobs": 0.0, "runtime": 0.0}


def test_status_table_names_each_owner(run: Replay) -> None:
    assert run.store is not None
    status = status_from_store(run.store)
    table = render_status(status, [])
    rows = {}
    for line in table.splitlines():
        cols = line.split(None, 6)
        if len(cols) == 7 and cols[1] in OWNERS:
            rows[cols[1]] = cols[6].strip()
    assert rows == OWNER_COLUMN
    procs = {p["pid"]: p for g in status["gpus"] for p in g["processes"]}
    assert procs[5101]["owner"]["image"] == "jupyter/scipy:2024"
    assert procs[5103]["owner"] is None and procs[7302]["owner"] is None


def _leak_alerts(run: Replay) -> list[dict[str, Any]]:
    return [a for body in run.sinks["webhook"].bodies() for a in body["alerts"]
            if a["labels"]["alertname"] == "GpuMemoryLeak" and a["status"] == "firing"]


def test_leak_alert_carries_the_pod_for_routing_and_the_message_names_it(run: Replay) -> None:
    alerts = _leak_alerts(run)
    assert alerts, "GpuMemoryLeak never fired for pid 4242"
    for a in alerts:
        lab = a["labels"]
        assert lab["pid"] == "4242"
        assert {k: lab.get(k) for k in OWNERS["4242"]} == OWNERS["4242"]
        assert "hpc_job" not in lab
        assert "python[4242] in pod ml/trainer-0 container trainer grows" in a["annotations"]["summary"]
    texts = [message_text(b, "slack") for b in run.sinks["slack"].bodies()]
    assert any("python[4242] in pod ml/trainer-0 container trainer" in t for t in texts), texts
