"""Attribution under hostile input: FIFOs, devices, huge and deep files in the fake /proc, the runtimes' state and
the job-mapping directory; Unicode digits and absurd lengths in job ids; names with control or bidi characters;
a kubelet answering thousands of pods or names no Kubernetes object can have. Each is read bounded, never blocks,
is counted in gpuwatchd_attribution_errors_total and said once in the log; the owners that can be known still are.

A regression here would hang the event loop: each resolve runs in a thread the test waits for with a deadline."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpuwatchd.config.attribution import AttributionConfig
from gpuwatchd.config.types import validate
from gpuwatchd.model import Attribution, GpuSample, ProcessSample, Snapshot
from gpuwatchd.sources.attribution import cgroup
from gpuwatchd.sources.attribution.kubelet import MAX_GPU_PODS, list_gpu_pods
from gpuwatchd.sources.attribution.task import AttributionTask
from tests.sources.attribution.kubelet_server import serve
from tests.sources.attribution.test_cgroup import FIXTURES, D

G0 = "GPU-11111111-2222-3333-4444-555555555555"
DOCKER = (FIXTURES / "docker-v2-systemd.cgroup").read_text()
T = TypeVar("T")


def _within(fn: Callable[[], T], seconds: float = 60.0) -> T:
    """``fn()`` in a thread; fails (instead of hanging the suite) when it has not returned after ``seconds``."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"blocked for over {seconds:g} s"
    return out[0]  # type: ignore[no-any-return]


def _snap(pids: list[int]) -> Snapshot:
    return Snapshot(timestamp=1.0, nvml_ok=True, gpus=(GpuSample(
        uuid=G0, index=0, processes=tuple(ProcessSample(pid=p, name="python") for p in pids)),))


def _task(tmp: Path, **extra: object) -> AttributionTask:
    cfg = validate(AttributionConfig, {
        "proc_root": str(tmp / "proc"), "host_root": str(tmp / "host"),
        "kubernetes": {"pod_resources_socket": str(tmp / "kubelet.sock"), "timeout": 10.0}, **extra})
    return AttributionTask(cfg, socket_explicit=False)


def _cgroup(tmp: Path, pid: int, text: str | None = None) -> Path:
    d = tmp / "proc" / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    if text is not None:
        (d / "cgroup").write_text(text)
    return d / "cgroup"


def test_a_fifo_device_or_huge_cgroup_file_is_unreadable_counted_once_and_never_blocks(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    os.mkfifo(_cgroup(tmp_path, 10))  # no writer: a plain open() blocks the event loop for good
    _cgroup(tmp_path, 11).symlink_to("/dev/zero")  # read_text() never ends
    _cgroup(tmp_path, 12, DOCKER + "1:name=x:/" + "a" * (100 << 10) + "\n")  # 100 KiB: over the bound
    _cgroup(tmp_path, 13, DOCKER)
    loop = _cgroup(tmp_path, 14)
    loop.symlink_to(loop)  # ELOOP
    task = _task(tmp_path)
    a: Attribution = _within(lambda: task.resolve(_snap([10, 11, 12, 13, 14])))
    assert set(a.owners) == {(G0, 13)} and a.owners[(G0, 13)].container_id == D[:12]
    assert a.errors["cgroup"] == 4
    a = _within(lambda: task.resolve(_snap([10, 11, 12, 13, 14]), now=1e6))  # re-read: still once per pid
    assert a.errors["cgroup"] == 4
    lines = [r.message for r in caplog.records if "cgroup of a GPU process" in r.message]
    assert len(lines) == 1 and "not a regular file (a FIFO)" in lines[0], lines


@pytest.mark.parametrize("path", [
    "/system.slice/slurmstepd.scope/job_\u0661\u0663/step_0",  # Arabic-Indic digits
    "/system.slice/slurmstepd.scope/job_\uff11\uff13/step_0",  # fullwidth digits
    "/system.slice/slurmstepd.scope/job_" + "9" * 5000 + "/step_0",  # past CPython's int() limit, a 5 KB label
    "/machine.slice/machine-evil\\x0a\\x1b[31mname.scope",  # escaped newline and ESC in an nspawn name
    "/machine.slice/machine-" + "n" * 200 + ".scope",
    "/machine.slice/machine-a\\x22b.scope",  # a quote
])
def test_job_ids_and_machine_names_are_ascii_and_bounded(path: str) -> None:
    assert cgroup.parse(f"0::{path}\n") == cgroup.HOST


def test_a_slurm_job_and_a_machine_name_in_shape_are_kept() -> None:
    assert cgroup.parse("0::/system.slice/slurmstepd.scope/job_12345678901234567890/step_0\n").hpc_job == \
        "12345678901234567890"
    assert cgroup.parse("0::/machine.slice/machine-trainer\\x2d01.scope\n").container_id == "trainer-01"


def _docker_files(tmp: Path, cid: str) -> Path:
    d = tmp / "host/var/lib/docker/containers" / cid
    d.mkdir(parents=True)
    return d / "config.v2.json"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "deep", "huge", "not-object", "symlink-loop", "not-utf8"])
def test_an_unusable_runtime_file_is_not_known_counted_once_and_never_blocks(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str) -> None:
    f = _docker_files(tmp_path, D)
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "dev-zero":
        f.symlink_to("/dev/zero")
    elif kind == "deep":
        f.write_text("[" * 500_000 + "]" * 500_000)  # json.loads raised RecursionError out of the poll
    elif kind == "symlink-loop":
        f.symlink_to(f)
    elif kind == "not-utf8":
        f.write_bytes(b'{"Name": "/\xff\xfe"}')
    elif kind == "huge":
        f.write_text(json.dumps({"Name": "/x", "Config": {"Image": "i"}, "pad": "p" * (2 << 20)}))
    else:
        f.write_text("[1, 2]")
    _cgroup(tmp_path, 20, DOCKER)
    _cgroup(tmp_path, 21, DOCKER)  # the same container: its file is read once
    task = _task(tmp_path)
    a: Attribution = _within(lambda: task.resolve(_snap([20, 21])))
    assert a.owners[(G0, 20)].labels() == {"container_id": D[:12]} and a.owners[(G0, 20)].name is None
    assert a.errors["runtime"] == 1
    lines = [r.message for r in caplog.records if "runtime file unusable" in r.message]
    assert len(lines) == 1 and str(f) in lines[0], lines


def test_runtime_names_with_control_bidi_or_absurd_lengths_are_not_used(tmp_path: Path) -> None:
    _docker_files(tmp_path, D).write_text(json.dumps({
        "Name": "/render\x1b[2J", "Config": {"Image": "i" * 600, "Labels": {
            "io.kubernetes.pod.namespace": "ml", "io.kubernetes.pod.name": "trainer\u202e0-gnp",
            "io.kubernetes.container.name": "c" * 300}}}))
    _cgroup(tmp_path, 30, DOCKER)
    a = _task(tmp_path).resolve(_snap([30]))
    o = a.owners[(G0, 30)]
    assert (o.name, o.image, o.pod, o.container) == (None, None, None, None)
    assert o.labels() == {"container_id": D[:12]} and a.errors["runtime"] == 0  # the file is fine, its values not
    # quotes and markup are names a runtime accepts: kept (the exposition format and the page escape them)
    other = "e" * 64
    _docker_files(tmp_path, other).write_text(json.dumps({"Name": '/a"<b>', "Config": {"Image": "img:1"}}))
    _cgroup(tmp_path, 31, DOCKER.replace(D, other))
    assert _task(tmp_path).resolve(_snap([31])).owners[(G0, 31)].name == 'a"<b>'


async def test_a_hostile_job_mapping_directory_is_bounded_counted_and_said_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text('777\n"quoted"\n' + "x" * 1000 + "\na,b\n\u0661\u0663\n\x1b[31m\n")
    os.mkfifo(jobs / "1")  # no writer: blocked the refresh
    (jobs / "2").symlink_to("/dev/zero")
    (jobs / "3").write_text("9\n" * 20_000)  # 40 KB: over the bound
    (jobs / "\u0664").write_text("888\n")  # Arabic-Indic 4 is not GPU 4
    (jobs / ("9" * 200)).write_text("999\n")  # int() of it is no GPU index
    for i in range(12_000):  # more entries than are looked at
        (jobs / f"junk-{i}").touch()
    _cgroup(tmp_path, 40, (FIXTURES / "host-session-v2.cgroup").read_text())
    task = _task(tmp_path, hpc_job_mapping_dir=str(jobs))
    await task.refresh()
    await task.refresh()
    assert set(task.jobs) <= {0} and task.jobs.get(0, ("777",)) == ("777",)
    assert task.errors["hpc_jobs"] == 2  # per refresh that skipped something
    lines = [r.message for r in caplog.records if "job mapping directory" in r.message]
    assert len(lines) == 1 and "skipped" in lines[0], lines
    (jobs / "0").write_text("777\n")
    for p in jobs.iterdir():
        if p.name != "0":
            p.unlink()
    await task.refresh()
    assert task.jobs == {0: ("777",)} and task.errors["hpc_jobs"] == 2
    assert task.resolve(_snap([40])).owners[(G0, 40)].labels() == {"hpc_job": "777"}


async def test_a_gpu_index_with_leading_zeros_never_competes_with_its_own_file(tmp_path: Path) -> None:
    """``3`` and ``0003`` both named GPU 3 and the one listed last won: only ``3`` is GPU 3's (counted skip)."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "3").write_text("333\n")
    (jobs / "0003").write_text("999\n")
    (jobs / "03").write_text("998\n")
    (jobs / "00").write_text("997\n")
    task = _task(tmp_path, hpc_job_mapping_dir=str(jobs))
    await task.refresh()
    assert task.jobs == {3: ("333",)}
    assert task.errors["hpc_jobs"] == 1  # the refresh that skipped them


async def test_a_kubelet_answering_thousands_of_pods_or_hostile_names_is_bounded(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pods: dict[tuple[str, str], dict[str, list[tuple[str, list[str]]]]] = {
        ("ml", f"p{i}"): {"c": [("nvidia.com/gpu", [f"{G0}::{i}"])]} for i in range(MAX_GPU_PODS + 500)}
    pods[("ml", "x" * 300)] = {"c": [("nvidia.com/gpu", [G0])]}  # longer than Kubernetes allows
    pods[("ml\nevil", "p")] = {"c": [("nvidia.com/gpu", [G0])]}
    pods[("ml", "p")] = {"c\u202e": [("nvidia.com/gpu", [G0])]}
    pods[("ml", "q")] = {"c": [("nvidia.com/gpu", ["GPU-" + "f" * 200_000])]}  # a 200 KB uuid
    sock = tmp_path / "kubelet.sock"
    with serve(sock, pods):
        got = list_gpu_pods(sock, timeout=30.0)
        assert len(got.pods) == MAX_GPU_PODS and got.skipped == 504
        task = AttributionTask(validate(AttributionConfig,
            {"kubernetes": {"pod_resources_socket": str(sock), "timeout": 30.0}}), socket_explicit=True)
        await task.refresh()
        await task.refresh()
    assert len(task.pods) == MAX_GPU_PODS and task.errors["kubernetes"] == 2
    assert all(len(p.uuid) < 100 and "\n" not in p.namespace for p in task.pods)
    lines = [r.message for r in caplog.records if "allocations skipped" in r.message]
    assert len(lines) == 1, lines


@pytest.mark.parametrize("kind", ["fifo", "file"])
async def test_a_socket_path_that_is_a_fifo_or_a_file_fails_at_once(tmp_path: Path, kind: str) -> None:
    sock = tmp_path / "kubelet.sock"
    if kind == "fifo":
        os.mkfifo(sock)
    else:
        sock.write_text("x" * 100)
    task = AttributionTask(validate(AttributionConfig,
        {"kubernetes": {"pod_resources_socket": str(sock), "timeout": 30.0}}), socket_explicit=True)
    await task.refresh()
    assert task.errors["kubernetes"] == 1 and task.pods == ()
