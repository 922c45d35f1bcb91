"""`gpuwatchd sim --scenario attribution` with a real gRPC kubelet on a unix socket: the daemon's own wiring
(snapshot -> attribution -> store) names every process' owner on /metrics and in `gpuwatchd status`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support import ROOT, DaemonProcess, Samples, labels_of, metrics_when
from test_sim_cli import interrupt, start_sim

from tests.sources.attribution.kubelet_server import serve
from tests.sources.attribution.test_scenario import KUBELET, OWNER_COLUMN, OWNERS


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[list[DaemonProcess]]:
    running: list[DaemonProcess] = []
    yield running
    for d in running:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def test_sim_attribution_metrics_and_status(sim: list[DaemonProcess], tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"
    cfg = tmp_path / "gpuwatchd.yml"
    # no runtime files at all here (host_root empty): the shared GPU's pods stay unnamed for both processes
    (tmp_path / "host").mkdir()
    cfg.write_text(yaml.safe_dump({"attribution": {"host_root": str(tmp_path / "host"), "kubernetes": {
        "pod_resources_socket": str(sock), "interval": "1s", "timeout": "10s"}}}))
    want = {**OWNERS, "5101": {"container_id": "bbbbbbbbbbbb"}}
    with serve(sock, KUBELET):
        d = start_sim(sim, tmp_path, "--scenario", "attribution", "--speed", "5", "--config", str(cfg))

        def attributed(m: Samples) -> bool:
            mem = labels_of(m, "gpuwatchd_gpu_process_memory_used_bytes")
            return {x["pid"] for x in mem} == set(want) and any(x.get("pod") for x in mem)

        samples = metrics_when(d, attributed, "every scenario process exported with its owner")
        for lab in labels_of(samples, "gpuwatchd_gpu_process_memory_used_bytes"):
            assert {k: v for k, v in lab.items() if k not in ("uuid", "pid", "process")} == want[lab["pid"]]
        assert len(labels_of(samples, "gpuwatchd_gpu_pod_info")) == 4
        out = subprocess.run([sys.executable, "-m", "gpuwatchd", "status", "--url", d.url], check=False,
                             capture_output=True,
                             text=True, timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert out.returncode == 0, out.stderr
        rows = {c[1]: c[6].strip() for line in out.stdout.splitlines()
                if len(c := line.split(None, 6)) == 7 and c[1] in want}
        assert rows == {**OWNER_COLUMN, "5101": "container bbbbbbbbbbbb"}
        assert interrupt(d) == 0


def test_sim_attribution_with_hostile_runtime_files_and_job_directory(sim: list[DaemonProcess],
                                                                      tmp_path: Path) -> None:
    """A FIFO where a container's config.json should be (it hung the event loop at the first snapshot: /metrics
    never answered), and a job-mapping directory of a FIFO, /dev/zero, a Unicode-digit name and a huge file: the
    daemon answers, every owner that can be known is, and each problem is counted and said once."""
    sock = tmp_path / "kubelet.sock"
    host = tmp_path / "host"
    bundle = host / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / ("a" * 64)
    bundle.mkdir(parents=True)
    os.mkfifo(bundle / "config.json")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    os.mkfifo(jobs / "0")
    (jobs / "1").symlink_to("/dev/zero")
    (jobs / "\u0662").write_text("4242\n")  # Arabic-Indic 2 is not GPU 2
    (jobs / "3").write_text("9\n" * 20_000)
    cfg = tmp_path / "gpuwatchd.yml"
    cfg.write_text(yaml.safe_dump({"attribution": {"host_root": str(host), "hpc_job_mapping_dir": str(jobs),
                                                   "kubernetes": {"pod_resources_socket": str(sock),
                                                                  "interval": "1s", "timeout": "10s"}}}))
    want = {**OWNERS, "5101": {"container_id": "bbbbbbbbbbbb"}}
    with serve(sock, KUBELET):
        d = start_sim(sim, tmp_path, "--scenario", "attribution", "--speed", "5", "--config", str(cfg))

        def attributed(m: Samples) -> bool:
            mem = labels_of(m, "gpuwatchd_gpu_process_memory_used_bytes")
            errors = _errors(m)
            return {x["pid"] for x in mem} == set(want) and errors.get("hpc_jobs", 0) >= 2

        samples = metrics_when(d, attributed, "every process exported with its owner, the job directory read twice")
        for lab in labels_of(samples, "gpuwatchd_gpu_process_memory_used_bytes"):
            assert {k: v for k, v in lab.items() if k not in ("uuid", "pid", "process")} == want[lab["pid"]]
        errors = _errors(samples)
        assert errors["runtime"] == 1 and errors["cgroup"] == 0 and errors["kubernetes"] == 0
        assert interrupt(d) == 0
    log = d.log()
    assert log.count("runtime file unusable") == 1 and log.count("job mapping directory") == 1, log
    assert "Traceback" not in log, log


def _errors(m: Samples) -> dict[str, float]:
    return {dict(lab)["source"]: v for (n, lab), v in m.items() if n == "gpuwatchd_attribution_errors_total"}
