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


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


# PodMonitor keys the port below models; any other would change the job in ways it does not know.
_MODELLED_SPEC = {"jobLabel", "selector", "podMetricsEndpoints"}
_MODELLED_ENDPOINT = {"port", "path", "interval", "honorLabels", "relabelings", "metricRelabelings"}


def _relabel(rc: dict[str, Any]) -> dict[str, Any]:
    """A PodMonitor RelabelConfig as the operator writes it (promcfg.go generateRelabelConfig): snake_case keys,
    the action lower-cased."""
    keys = {"sourceLabels": "source_labels", "separator": "separator", "targetLabel": "target_label", "regex": "regex",
            "modulus": "modulus", "replacement": "replacement", "action": "action"}
    out = {keys[k]: v for k, v in rc.items()}
    if "action" in out:
        out["action"] = out["action"].lower()
    return out


def operator_scrape_job(pm: dict[str, Any]) -> dict[str, Any]:
    """The scrape job the Prometheus Operator generates for a PodMonitor's single endpoint, ported from
    pkg/prometheus/promcfg.go generatePodMonitorConfig (prometheus-operator 6adcebc, Aug 2026) for the keys this kit
    uses, with the default selector mechanism (relabel) and one shard (its sharding rules, a no-op then, left out)."""
    spec, ns, name = pm["spec"], pm["metadata"]["namespace"], pm["metadata"]["name"]
    assert set(spec) <= _MODELLED_SPEC, set(spec) - _MODELLED_SPEC
    (ep,) = spec["podMetricsEndpoints"]
    assert set(ep) <= _MODELLED_ENDPOINT, set(ep) - _MODELLED_ENDPOINT
    assert set(spec["selector"]) == {"matchLabels"}
    relabel: list[dict[str, Any]] = [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
    ]
    for k in sorted(spec["selector"]["matchLabels"]):
        relabel.append({"action": "keep", "source_labels": [f"__meta_kubernetes_pod_label_{_sanitize(k)}",
                                                            f"__meta_kubernetes_pod_labelpresent_{_sanitize(k)}"],
                        "regex": f"({spec['selector']['matchLabels'][k]});true"})  # fmt: skip
    relabel.append({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": ep["port"]})  # fmt: skip
    relabel += [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{ns}/{name}"},
    ]
    if spec.get("jobLabel"):
        relabel.append({"source_labels": [f"__meta_kubernetes_pod_label_{_sanitize(spec['jobLabel'])}"],
                        "target_label": "job", "regex": "(.+)", "replacement": "${1}"})  # fmt: skip
    relabel.append({"target_label": "endpoint", "replacement": ep["port"]})
    relabel += [_relabel(r) for r in ep.get("relabelings", [])]
    job: dict[str, Any] = {
        "job_name": f"podMonitor/{ns}/{name}/0",
        "honor_labels": bool(ep.get("honorLabels", False)),
        "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [ns]}}],
    }
    if ep.get("interval"):
        job["scrape_interval"] = ep["interval"]
    if ep.get("path"):
        job["metrics_path"] = ep["path"]
    job["relabel_configs"] = relabel
    if ep.get("metricRelabelings"):
        job["metric_relabel_configs"] = [_relabel(r) for r in ep["metricRelabelings"]]
    return job


def test_the_written_out_scrape_job_is_what_the_operator_makes_of_the_podmonitor() -> None:
    """deploy/kubernetes/prometheus-scrape.yml is the PodMonitor's job, key for key (tests/integration/
    test_kubernetes_fleet.py runs that file on a real Prometheus)."""
    [job] = yaml.safe_load((DEPLOY / "prometheus-scrape.yml").read_text())["scrape_configs"]
    assert job == operator_scrape_job(DOCS["PodMonitor"])
    # the port itself can tell a change apart: without jobLabel the job would be "<namespace>/<name>"
    bare = copy.deepcopy(DOCS["PodMonitor"])
    del bare["spec"]["jobLabel"]
    assert operator_scrape_job(bare) != job


def _relabelled(job: dict[str, Any], meta: dict[str, str]) -> dict[str, str]:
    """The target labels a job's relabel_configs give a discovered target (Prometheus' replace/keep/drop/labeldrop
    with anchored regexes and ${1}); empty when it is dropped."""
    labels = dict(meta)
    for rc in job["relabel_configs"]:
        action = rc.get("action", "replace")
        regex = re.compile(rc.get("regex", "(.*)"))
        if action == "labeldrop":
            labels = {k: v for k, v in labels.items() if not regex.fullmatch(k)}
            continue
        value = rc.get("separator", ";").join(labels.get(x, "") for x in rc.get("source_labels", []))
        m = regex.fullmatch(value)
        if (action == "keep" and m is None) or (action == "drop" and m is not None):
            return {}
        if action == "replace" and m is not None:
            repl = rc.get("replacement", "$1").replace("${1}", r"\1").replace("$1", r"\1")
            labels[rc["target_label"]] = m.expand(repl)
    return {k: v for k, v in labels.items() if not k.startswith("__")}


def test_the_job_labels_every_target_gpuwatchd_and_by_its_node() -> None:
    """The rules' `up{job="gpuwatchd"}` and `by (host)` see the kit's targets: job is the pod's app name, host the
    node's name; the target's namespace/pod/container are gone (they name GPU processes' owners on the series)."""
    [job] = yaml.safe_load((DEPLOY / "prometheus-scrape.yml").read_text())["scrape_configs"]
    pod_labels = DS["spec"]["template"]["metadata"]["labels"]
    meta = {"__address__": "10.244.3.7:9945", "__meta_kubernetes_namespace": "gpuwatchd",
            "__meta_kubernetes_pod_name": "gpuwatchd-x7k2q", "__meta_kubernetes_pod_node_name": "gpu-node-17",
            "__meta_kubernetes_pod_phase": "Running", "__meta_kubernetes_pod_container_name": CTR["name"],
            "__meta_kubernetes_pod_container_port_name": CTR["ports"][0]["name"]}  # fmt: skip
    for k, v in pod_labels.items():
        meta[f"__meta_kubernetes_pod_label_{_sanitize(k)}"] = v
        meta[f"__meta_kubernetes_pod_labelpresent_{_sanitize(k)}"] = "true"
    assert _relabelled(job, meta) == {"job": "gpuwatchd", "host": "gpu-node-17", "endpoint": "metrics"}
    assert _relabelled(job, {**meta, "__meta_kubernetes_pod_phase": "Failed"}) == {}
    fleet_down = next(r for g in yaml.safe_load((ROOT / "deploy/prometheus/gpuwatchd-fleet.rules.yml").read_text())
                      ["groups"] for r in g["rules"] if r.get("alert") == "GpuwatchdDown")  # fmt: skip
    assert 'job="gpuwatchd"' in fleet_down["expr"]


def test_the_daemon_is_told_its_node_name_through_the_downward_api() -> None:
    from gpuwatchd.config.loader import HOST_ENV

    env = {e["name"]: e for e in CTR["env"]}
    assert env[HOST_ENV] == {"name": HOST_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    _, text = _config_text()
    assert "host" not in yaml.safe_load(text)  # a `host:` in the shared ConfigMap would name every node alike


def test_the_commented_receiver_posts_to_every_in_cluster_alertmanager(tmp_path: Path) -> None:
    """Uncommented as a user would, the ConfigMap's notify section is valid and lists each member of the operator's
    Alertmanager by its pod's name under the headless Service, never the Service itself."""
    key, text = _config_text()
    lines = text.splitlines()
    start = lines.index("# notify:")
    block = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        block.append(line[2:].split("   #")[0])
    assert len(block) > 5
    f = tmp_path / key
    f.write_text(text + "\n" + "\n".join(block) + "\n")
    cfg = load_config(f)
    [rc] = cfg.notify.receivers
    assert rc.type == "alertmanager" and len(rc.members) >= 2
    for i, m in enumerate(rc.members):
        assert re.fullmatch(rf"http://alertmanager-(\w+)-{i}\.alertmanager-operated\.(\w+)\.svc:9093",
                            m.url.get_secret_value()), m.url.get_secret_value()  # fmt: skip


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
