"""Owner resolution (sources/attribution/task.py): cgroups in a fake /proc, a real gRPC kubelet on a unix socket,
runtime files, the job-mapping directory, and a kubelet that goes missing, slow or broken."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import grpc
import pytest

from gpuwatchd.config.attribution import AttributionConfig
from gpuwatchd.config.types import replace, validate
from gpuwatchd.model import GpuSample, ProcessSample, Snapshot
from gpuwatchd.sources.attribution.task import AttributionTask
from tests.sources.attribution.kubelet_server import serve
from tests.sources.attribution.test_cgroup import FIXTURES, D
from tests.sources.attribution.test_kubelet import G0, G1, M0, PODS

G2 = "GPU-99999999-8888-7777-6666-555555555555"
CID = "8d1e4b2a9f3c7e6d5b4a3928170f6e5d4c3b2a19087f6e5d4c3b2a1908f7e6d5"
KUBE_A = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/cri-containerd-{c}.scope\n"


def _proc(root: Path, pid: int, text: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(text)


def _snap(*gpus: tuple[str, int, list[int]]) -> Snapshot:
    return Snapshot(timestamp=100.0, nvml_ok=True, gpus=tuple(
        GpuSample(uuid=u, index=i, processes=tuple(ProcessSample(pid=p, name="python") for p in pids))
        for u, i, pids in gpus))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    _proc(proc, 100, KUBE_A.format(u="7d3a5c1e_2b4f_4c6d_8e9f_0a1b2c3d4e5f", c=CID))  # trainer-0 on G0
    _proc(proc, 200, KUBE_A.format(u="aaaa5c1e_2b4f_4c6d_8e9f_0a1b2c3d4e5f", c="a" * 64))  # on shared G1, no files
    _proc(proc, 201, KUBE_A.format(u="bbbb5c1e_2b4f_4c6d_8e9f_0a1b2c3d4e5f", c="b" * 64))  # on shared G1, files
    _proc(proc, 300, (FIXTURES / "host-session-v2.cgroup").read_text())  # host process on G1
    _proc(proc, 400, (FIXTURES / "docker-v2-systemd.cgroup").read_text())  # plain Docker on G2
    _proc(proc, 500, (FIXTURES / "host-service-v2.cgroup").read_text())  # host process on G2 (job mapped)
    _proc(proc, 600, (FIXTURES / "slurm-v2.cgroup").read_text())  # Slurm cgroup: its own job
    bundle = tmp_path / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / ("b" * 64)
    bundle.mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.1.0", "annotations": {
        "io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-name": "notebook-b",
        "io.kubernetes.cri.sandbox-namespace": "research", "io.kubernetes.cri.container-name": "jupyter",
        "io.kubernetes.cri.image-name": "jupyter/scipy-notebook:2024"}}))
    docker = tmp_path / "var/lib/docker/containers" / D
    docker.mkdir(parents=True)
    (docker / "config.v2.json").write_text(json.dumps({"Name": "/render", "Config": {"Image": "blender:4.1"}}))
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "2").write_text("777\n")
    (jobs / "README").write_text("not a GPU index\n")
    return tmp_path


def _cfg(tree: Path, **k8s: object) -> AttributionConfig:
    return validate(AttributionConfig, {
        "proc_root": str(tree / "proc"), "host_root": str(tree), "hpc_job_mapping_dir": str(tree / "jobs"),
        "kubernetes": {"pod_resources_socket": str(tree / "kubelet.sock"), "timeout": 5.0, **k8s}})


SNAP = _snap((G0, 0, [100]), (G1, 1, [200, 201, 300]), (G2, 2, [400, 500, 600]), (M0, 3, [999]))


async def test_every_process_gets_its_owner_and_host_processes_none(tree: Path) -> None:
    task = AttributionTask(_cfg(tree))
    with serve(tree / "kubelet.sock", PODS):
        await task.refresh()
    a = task.resolve(SNAP)
    o = a.owners
    assert o[(G0, 100)].labels() == {"container_id": CID[:12], "namespace": "ml", "pod": "trainer-0",
                                     "container": "trainer"}
    # G1 is shared by two pods: without runtime files the pod is not guessed; with them it is named
    assert o[(G1, 200)].labels() == {"container_id": "a" * 12}
    assert o[(G1, 201)].labels() == {"container_id": "b" * 12, "namespace": "research", "pod": "notebook-b",
                                     "container": "jupyter"}
    assert o[(G1, 201)].image == "jupyter/scipy-notebook:2024"
    assert (G1, 300) not in o  # host process on a pod's GPU: nothing
    assert o[(G2, 400)].labels() == {"container_id": "3f2a9c1b7d4e"}
    assert (o[(G2, 400)].name, o[(G2, 400)].image) == ("render", "blender:4.1")
    assert o[(G2, 400)].describe() == " in container 3f2a9c1b7d4e (render, blender:4.1)"
    assert o[(G2, 500)].labels() == {"hpc_job": "777"}  # mapping directory, GPU index 2
    assert o[(G2, 600)].labels() == {"hpc_job": "4242"}  # its own Slurm cgroup wins over the mapping
    assert (M0, 999) not in o  # no /proc entry: unknown, never a guess
    assert o[(G0, 100)].describe() == " in pod ml/trainer-0 container trainer"
    assert {p.uuid for p in a.pods} == {G0, G1, M0, "MIG-ffffffff-0000-1111-2222-333333333333"}
    assert a.errors == {"cgroup": 1, "kubernetes": 0, "hpc_jobs": 0, "runtime": 0}  # pid 999 unreadable, counted once
    assert task.resolve(SNAP).errors["cgroup"] == 1


async def test_a_replaced_pod_is_followed_at_the_next_refresh(tree: Path) -> None:
    task = AttributionTask(_cfg(tree))
    with serve(tree / "kubelet.sock", PODS) as kubelet:
        await task.refresh()
        assert task.resolve(SNAP).owners[(G0, 100)].pod == "trainer-0"
        # the pod is replaced: a new pod (uid), a new container, a new process on the same GPU
        kubelet.pods = {**{k: v for k, v in PODS.items() if k != ("ml", "trainer-0")},
                        ("ml", "trainer-1"): {"trainer": [("nvidia.com/gpu", [G0])]}}
        _proc(tree / "proc", 101, KUBE_A.format(u="dddd5c1e_2b4f_4c6d_8e9f_0a1b2c3d4e5f", c="d" * 64))
        await task.refresh()
        owners = task.resolve(_snap((G0, 0, [101]))).owners
        assert owners[(G0, 101)].labels() == {"container_id": "d" * 12, "namespace": "ml", "pod": "trainer-1",
                                              "container": "trainer"}
        assert {p.pod for p in task.pods if p.uuid == G0} == {"trainer-1"}


async def test_missing_slow_and_broken_kubelet_count_and_log_once(tree: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpuwatchd.sources.attribution.task")
    statuses = []
    # a timeout generous for a loaded machine: the slow kubelet below never answers, so it is cut there anyway
    task = AttributionTask(_cfg(tree, timeout=5.0), socket_explicit=True, on_status=statuses.append)
    await task.refresh()
    await task.refresh()  # missing twice: counted twice, logged once
    assert task.errors["kubernetes"] == 2
    assert sum("does not exist" in r.message for r in caplog.records) == 1
    with serve(tree / "kubelet.sock", PODS) as kubelet:
        await task.refresh()
        assert task.errors["kubernetes"] == 2 and task.pods
        assert sum("answers again" in r.message for r in caplog.records) == 1
        kubelet.delay = 600.0
        assert task.resolve(SNAP).owners[(G0, 100)].pod == "trainer-0"
        await task.refresh()  # slow: cut at the deadline, pods dropped (stale pods would name the wrong owner)
        assert task.errors["kubernetes"] == 3 and task.pods == ()
        # ... but a container already attributed keeps its pod (it cannot change pods): no alert flaps
        assert task.resolve(SNAP).owners[(G0, 100)].pod == "trainer-0"
        kubelet.delay = 0.0
        kubelet.fail = grpc.StatusCode.UNAVAILABLE
        await task.refresh()
        assert task.errors["kubernetes"] == 4
    assert [s.success for s in statuses if s.name == "attribution_kubernetes"] == [False, False, True, False, False]
    assert sum("List failed" in r.message for r in caplog.records) == 1  # one line per streak


async def test_default_socket_absent_is_not_an_error(tree: Path) -> None:
    task = AttributionTask(_cfg(tree), socket_explicit=False)
    await task.refresh()
    assert task.errors["kubernetes"] == 0 and task.pods == ()


async def test_unreadable_job_directory_is_an_error(tree: Path) -> None:
    cfg = replace(_cfg(tree), hpc_job_mapping_dir=tree / "no-such-dir")
    task = AttributionTask(cfg, socket_explicit=False)
    await task.refresh()
    assert task.errors["hpc_jobs"] == 1 and task.jobs == {}


def test_due_cgroup_rereads_are_spread_over_polls(tree: Path) -> None:
    # Pids listed together fall due together: a resolve re-reads at most CGROUP_REREADS_MIN (or a tenth of the
    # cached pids) of them, later polls the rest, so a 16 x 256 host no longer re-reads 4,096 files in one poll.
    from gpuwatchd.sources.attribution import task as task_module

    pids = list(range(1000, 1000 + 2 * task_module.CGROUP_REREADS_MIN + 10))
    for pid in pids:
        _proc(tree / "proc", pid, (FIXTURES / "docker-v2-systemd.cgroup").read_text())
    snap = _snap((G2, 2, pids))
    task = AttributionTask(_cfg(tree))
    first = task.resolve(snap, now=0.0)  # new pids: all read at once
    assert all(first.owners[(G2, pid)].labels() == {"container_id": D[:12]} for pid in pids)
    for pid in pids:  # every one moved (as reused pids would be)
        _proc(tree / "proc", pid, (FIXTURES / "host-session-v2.cgroup").read_text())
    assert task.resolve(snap, now=10.0).owners is first.owners  # nothing due, nothing read: the same owners
    moved = []
    for poll in range(3):
        owners = task.resolve(snap, now=31.0 + poll).owners
        moved.append(sum((G2, pid) not in owners for pid in pids))
    assert moved == [task_module.CGROUP_REREADS_MIN, 2 * task_module.CGROUP_REREADS_MIN, len(pids)]
    settled = task.resolve(snap, now=40.0).owners
    assert settled == {}
    # re-reads that find what was there keep the owners map itself (the per-process families are reused with it)
    assert task.resolve(snap, now=80.0).owners is settled


def test_same_pids_reuse_the_owners_until_a_recheck_or_new_answers_are_due(tree: Path) -> None:
    # The per-poll path at 16 x 256: no /proc read while the same pids are listed and no re-read is due.
    task = AttributionTask(_cfg(tree))
    first = task.resolve(SNAP, now=0.0)
    assert first.owners[(G2, 400)].labels() == {"container_id": D[:12]}
    _proc(tree / "proc", 400, (FIXTURES / "host-session-v2.cgroup").read_text())  # moved (as a reused pid would be)
    _proc(tree / "proc", 401, (FIXTURES / "docker-v2-systemd.cgroup").read_text())
    assert task.resolve(SNAP, now=10.0).owners == first.owners  # nothing read
    # a new pid is read at once (and the others from the cache)
    more = task.resolve(_snap((G0, 0, [100]), (G1, 1, [200, 201, 300]), (G2, 2, [400, 401, 500, 600])), now=11.0)
    assert more.owners[(G2, 401)].labels() == {"container_id": D[:12]}
    assert more.owners[(G2, 400)].labels() == {"container_id": D[:12]}
    # the re-read is due 30 s after the read: the pid's new cgroup shows
    again = task.resolve(_snap((G0, 0, [100]), (G1, 1, [200, 201, 300]), (G2, 2, [400, 401, 500, 600])), now=31.0)
    assert (G2, 400) not in again.owners
    # new job answers are used at once, with the same pids
    (tree / "jobs" / "2").write_text("778\n")
    asyncio.run(task._refresh_jobs())
    jobs = task.resolve(_snap((G0, 0, [100]), (G1, 1, [200, 201, 300]), (G2, 2, [400, 401, 500, 600])), now=32.0)
    assert jobs.owners[(G2, 400)].labels() == {"hpc_job": "778"}


def test_rereads_that_find_nothing_new_keep_the_owners_a_full_resolve_would_make(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The fast path (same pids and answers, due re-reads, none finding another cgroup) against a task that makes
    # every owner again at every resolve, over two simulated minutes of processes moving between host, Docker,
    # Kubernetes (with and without runtime files) and Slurm cgroups, some unreadable, on a GPU shared by pods.
    import random

    from gpuwatchd.sources.attribution import task as task_module

    monkeypatch.setattr(task_module, "CGROUP_REREADS_MIN", 3)
    shapes = [
        KUBE_A.format(u="7d3a5c1e_2b4f_4c6d_8e9f_0a1b2c3d4e5f", c=CID),
        KUBE_A.format(u="aaaa5c1e_2b4f_4c6d_8e9f_0a1b2c3d4e5f", c="a" * 64),
        KUBE_A.format(u="bbbb5c1e_2b4f_4c6d_8e9f_0a1b2c3d4e5f", c="b" * 64),
        (FIXTURES / "host-session-v2.cgroup").read_text(),
        (FIXTURES / "docker-v2-systemd.cgroup").read_text(),
        (FIXTURES / "slurm-v2.cgroup").read_text(),
        None,  # unreadable: gone from /proc
    ]
    rng = random.Random(20)
    pids = list(range(2000, 2040))

    def place(pid: int) -> None:
        shape = rng.choice(shapes)
        target = tree / "proc" / str(pid) / "cgroup"
        if shape is None:
            target.unlink(missing_ok=True)
        else:
            _proc(tree / "proc", pid, shape)

    for pid in pids:
        place(pid)
    snap = _snap((G0, 0, pids[:10]), (G1, 1, pids[10:25]), (G2, 2, pids[25:]), (M0, 3, pids[:3]))
    fast = AttributionTask(_cfg(tree))
    full = AttributionTask(_cfg(tree))
    # the reference re-reads alike, then makes every owner again at every resolve with re-reads due
    monkeypatch.setattr(full, "_reread_due", lambda snap, now: AttributionTask._reread_due(full, snap, now) or True)
    fast_paths = 0
    now = 0.0
    while now < 120.0:
        before = fast._last[2] if fast._last is not None else None
        a, b = fast.resolve(snap, now=now), full.resolve(snap, now=now)
        assert a.owners == b.owners, now
        assert a.errors == b.errors
        fast_paths += a.owners is before and now >= 30.0
        if rng.random() < 0.15:  # now and then a pid is reused by a process elsewhere
            place(rng.choice(pids))
        now += rng.choice([0.5, 1.0, 1.0, 2.0, 7.0])
    assert fast_paths > 10  # the path under test was taken


def test_a_pod_learned_from_a_later_process_reaches_the_earlier_ones_at_the_next_resolve(tree: Path) -> None:
    # Process 101 shares a container (no runtime files) with 100. 101 is listed first, on a GPU two pods share, so
    # it gets no pod of its own; 100, on a GPU one pod holds, then teaches the container's pod. The pass that learned
    # it is not reused as it is: the next resolve (nothing due, the same pids) gives 101 the pod too, and every
    # resolve after keeps it (found by review: the re-read fast path kept 101 without it for good).
    from gpuwatchd.model import GpuPod

    _proc(tree / "proc", 101, KUBE_A.format(u="7d3a5c1e_2b4f_4c6d_8e9f_0a1b2c3d4e5f", c=CID))
    snap = _snap((G1, 0, [101]), (G0, 1, [100]))
    pods = (GpuPod(G0, "ml", "trainer-0", "trainer"), GpuPod(G1, "ml", "notebook-a", "jupyter"),
            GpuPod(G1, "research", "notebook-b", "jupyter"))
    task = AttributionTask(_cfg(tree))
    task._set_pods(pods)
    first = task.resolve(snap, now=0.0)
    assert first.owners[(G0, 100)].pod == "trainer-0"
    for now in (1.0, 2.0, 31.0, 62.0, 200.0):
        owners = task.resolve(snap, now=now).owners
        assert owners[(G1, 101)].pod == "trainer-0", now
        assert owners[(G1, 101)].namespace == "ml"
    assert task.resolve(snap, now=201.0).owners is owners  # settled: reused again
