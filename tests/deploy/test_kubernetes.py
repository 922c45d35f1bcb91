"""deploy/kubernetes: every manifest validates against the schema of a current Kubernetes release (offline, with
kubernetes-validate), and the DaemonSet's command line, ports, probes and mounts agree with what the daemon
actually reads and serves, so the manifests cannot rot silently. CI does not build or run the image."""

from __future__ import annotations

import asyncio
import copy
import os
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuwatchd.cli.commands import _build_parser
from gpuwatchd.config.loader import Config, load_config
from gpuwatchd.config.types import replace

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
# The newest release whose schema the installed kubernetes-validate ships (offline: no download at test time).
K8S_VERSION = kubernetes_validate.latest_version()
CRDS = {"PodMonitor"}  # monitoring.coreos.com: not in the Kubernetes schema; checked field by field below


def _docs() -> dict[str, dict[str, Any]]:
    out = {}
    for f in sorted(DEPLOY.glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(f.read_text()):
            out[doc["kind"]] = doc
    return out


DOCS = _docs()
DS = DOCS["DaemonSet"]
POD = DS["spec"]["template"]["spec"]
CTR = POD["containers"][0]
VOLUMES = {v["name"]: v for v in POD["volumes"]}


@pytest.mark.parametrize("kind", sorted(k for k in DOCS if k not in CRDS))
def test_manifest_validates_against_the_kubernetes_schema(kind: str) -> None:
    kubernetes_validate.validate(DOCS[kind], K8S_VERSION, strict=True)


def test_the_validator_is_not_a_no_op() -> None:
    bad = copy.deepcopy(DS)
    bad["spec"]["template"]["spec"]["hostPID"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    typo = copy.deepcopy(DS)
    typo["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):  # strict: unknown fields are errors
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    k = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == sorted(f.name for f in DEPLOY.glob("*.yaml") if f.name != "kustomization.yaml")


def _mount(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The volumeMount (and its volume) under which ``path`` lies inside the container."""
    best = None
    for m in CTR["volumeMounts"]:
        mp = PurePosixPath(m["mountPath"])
        p = PurePosixPath(path)
        deeper = best is None or len(mp.parts) > len(PurePosixPath(best["mountPath"]).parts)
        if (p == mp or mp in p.parents) and deeper:
            best = m
    assert best is not None, f"{path} is not on any volume mounted into the container"
    return best, VOLUMES[best["name"]]


def _config_text() -> tuple[str, str]:
    argv = CTR["command"]
    assert argv[0] == "gpuwatchd"
    args = _build_parser().parse_args(argv[1:])
    assert args.command == "run" and args.config is not None
    m, vol = _mount(str(args.config))
    assert m.get("readOnly") is True and vol["configMap"]["name"] == DOCS["ConfigMap"]["metadata"]["name"]
    key = str(PurePosixPath(str(args.config)).relative_to(m["mountPath"]))
    return key, DOCS["ConfigMap"]["data"][key]


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    key, text = _config_text()
    f = tmp_path_factory.mktemp("cm") / key
    f.write_text(text)
    # the real CLI, as a user would run it on the ConfigMap's file
    r = subprocess.run([sys.executable, "-m", "gpuwatchd", "check-config", str(f)], capture_output=True, text=True,
                       timeout=120, check=False, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    return load_config(f)


def test_port_and_scrape_annotations_are_the_daemons_listen_port(config: Config) -> None:
    port = int(config.listen.rsplit(":", 1)[1])
    (p,) = CTR["ports"]
    assert p["containerPort"] == port and p["name"] == "metrics"
    ann = DS["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/port"] == str(port) and ann["prometheus.io/path"] == "/metrics"
    assert f"EXPOSE {port}" in (DEPLOY / "Containerfile").read_text()


def test_probes_use_the_daemons_health_endpoints() -> None:
    assert CTR["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert CTR["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_every_path_the_daemon_reads_is_mounted_as_it_needs(config: Config) -> None:
    # state: a writable hostPath, kept across pod restarts
    m, vol = _mount(str(config.state_dir))
    assert not m.get("readOnly") and vol["hostPath"]["type"] == "DirectoryOrCreate"
    # the kernel log: the host's /dev/kmsg, readable with CAP_SYSLOG, never a privileged container
    m, vol = _mount(str(config.kernel_log.path))
    assert config.kernel_log.enabled and vol["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    sc = CTR["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"]
    # /sys, read-only, where sysfs.root says
    m, vol = _mount(str(config.sysfs.root / "sys"))
    assert m["mountPath"] == str(config.sysfs.root / "sys") and m["readOnly"] is True
    assert vol["hostPath"]["path"] == "/sys"
    # the pod-resources DIRECTORY (the kubelet re-creates the socket on restart), not the socket file
    sock = PurePosixPath(str(config.attribution.kubernetes.pod_resources_socket))
    m, vol = _mount(str(sock))
    assert PurePosixPath(m["mountPath"]) == sock.parent and vol["hostPath"]["type"] == "Directory"
    assert vol["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    # GPU processes' /proc/PID/cgroup: the host PID namespace
    assert str(config.attribution.proc_root) == "/proc" and POD["hostPID"] is True
    # no API token: the daemon never calls the API server
    assert POD["automountServiceAccountToken"] is False


def test_resources_follow_the_benchmark() -> None:
    res = CTR["resources"]
    readme = (ROOT / "README.md").read_text()
    rss = float(re.search(r"RSS, daemon \+ NVML worker \(8 GPUs x 32 processes\) \| ([\d.]+) MB", readme).group(1))
    grpc_mb = 9.2  # measured: import of grpc + the pod-resources stubs (docs/kubernetes.md)
    req, lim = (int(res[k]["memory"].removesuffix("Mi")) * 1.048576 for k in ("requests", "limits"))  # MB
    assert rss + grpc_mb < req < lim


def test_podmonitor_scrapes_the_container_port_and_keeps_owner_labels() -> None:
    pm = DOCS["PodMonitor"]
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["spec"]["selector"]["matchLabels"].items() <= DS["spec"]["template"]["metadata"]["labels"].items()
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] == CTR["ports"][0]["name"] and ep["path"] == "/metrics"
    drops = [r for r in ep["relabelings"] if r.get("action") == "labeldrop"]
    assert drops and all(re.fullmatch(drops[0]["regex"], k) for k in ("namespace", "pod", "container"))


async def test_the_daemon_serves_the_probed_and_scraped_paths(config: Config, standin_libdir: Path,
                                                              tmp_path: Path) -> None:
    """The ConfigMap's config, run for real (only host paths moved into the test's sandbox): the probe and
    scrape paths answer as the kubelet and Prometheus expect."""
    import urllib.request

    from gpuwatchd.daemon import Daemon
    from gpuwatchd.sim.standin_abi import STATE_ENV
    from gpuwatchd.sim.state import make_state, write_state
    from gpuwatchd.sim.worker import WORKER_MODULE as SIM_WORKER_MODULE

    state = tmp_path / "sim-state"
    write_state(state, make_state(1))
    (tmp_path / "kmsg").write_bytes(b"")
    cfg = replace(
        config, listen="127.0.0.1:0", state_dir=tmp_path / "state",
        nvml=replace(config.nvml, library_path=standin_libdir),
        sysfs=replace(config.sysfs, root=tmp_path),
        kernel_log=replace(config.kernel_log, path=tmp_path / "kmsg"),
    )
    d = Daemon(cfg, worker_env={**os.environ, STATE_ENV: str(state)}, worker_module=SIM_WORKER_MODULE)
    await d.start()
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + 60
        while not d.ready():
            assert loop.time() < end, "daemon never ready"
            await asyncio.sleep(0.05)

        def get(path: str) -> tuple[int, str]:
            with urllib.request.urlopen(d.url + path, timeout=10) as r:
                return r.status, r.read().decode()

        for probe in ("livenessProbe", "readinessProbe"):
            status, _ = await asyncio.to_thread(get, CTR[probe]["httpGet"]["path"])
            assert status == 200, probe
        scrape = DS["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]
        status, body = await asyncio.to_thread(get, scrape)
        assert status == 200 and "gpuwatchd_gpu_memory_used_bytes" in body
        assert "gpuwatchd_attribution_errors_total" in body  # the default kubelet socket absent here: no error
    finally:
        await d.stop()
