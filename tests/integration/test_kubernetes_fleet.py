"""The Kubernetes kit meets the fleet kit on a real Prometheus (issue 28 §6, §8).

Two `gpuwatchd sim` daemons play the DaemonSet's pods on two nodes, each with the environment the DaemonSet gives its
container (GPUWATCHD_HOST from the downward API's spec.nodeName). A real Prometheus (Debian `prometheus`) runs the
scrape job the PodMonitor stands for, deploy/kubernetes/prometheus-scrape.yml, with its relabelings untouched, and the
fleet rules of deploy/prometheus/. Debian's Prometheus is built without Kubernetes discovery, so the job's
kubernetes_sd_configs (role: pod) is swapped for a file_sd file holding what pod discovery yields for those pods:
one target per container port with the `__meta_kubernetes_*` labels Prometheus' discovery/kubernetes/pod.go sets
(pod name, phase, node name, labels and their `labelpresent`, container and port names, ...). Beside the two
gpuwatchd pods the namespace holds pods the job must not scrape: another app's pod with a port also named
`metrics`, and a gpuwatchd pod that has Failed. That file is checked against a real Kubernetes discovery: a stand-in
API server here serves the same Pod objects (list and watch, JSON), and VictoriaMetrics (Debian `victoria-metrics`,
whose scraper has Kubernetes discovery) runs the kit's job with only `api_server` added; the labels its discovery
gives each target are the file's, and its relabelled targets are Prometheus's.

Shown: the `up` series the kit produces carry job="gpuwatchd" and host=<node name>; the fleet recording rules and
every fleet dashboard query answer by node name; the daemons' alerts carry the same host with no exported_host;
"PCIe links degraded" lists the busy GPU whose link stays low and not the idle GPUs whose link downshifted normally;
"GPUs by health" counts what the daemons' /api/v1/status says; killing one daemon fires GpuwatchdDown for its node.
Loopback only; every process is started here and stopped here.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import sys
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ROOT, START_SECONDS, free_port, wait_until
from test_fleet import Proc, dashboard_queries, http_json, http_ok, spawn

PROMETHEUS = shutil.which("prometheus")
VICTORIA = shutil.which("victoria-metrics") or shutil.which("victoria-metrics-prod")
K8S = ROOT / "deploy" / "kubernetes"
FLEET_RULES = ROOT / "deploy" / "prometheus" / "gpuwatchd-fleet.rules.yml"
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus (.ci/run installs it)")
EVENT_SECONDS = 120.0  # liveness bound on a loaded machine; each wait returns as soon as its condition holds


@dataclass(frozen=True)
class Node:
    name: str  # the node's name: spec.nodeName of its gpuwatchd pod
    scenario: str
    speed: float
    gpus: int | None = None


# gpu-node-a: Gen1 x4 of a Gen4 x16 link under full load from 30 s (GpuPcieLinkDegraded, GpuPcieReplays).
# gpu-node-b: two idle GPUs whose links sit at Gen1 of Gen4, the normal power-saving downshift.
NODES = (Node("gpu-node-a", "link-degraded", 4), Node("gpu-node-b", "idle", 1, gpus=2))
BUSY, IDLE = NODES


def manifests() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for f in sorted(K8S.glob("*.yaml")) if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text())}  # fmt: skip


def make_pod(name: str, node: str, port: int, *, template: dict[str, Any], owner: str, phase: str = "Running",
             namespace: str = "gpuwatchd") -> dict[str, Any]:  # fmt: skip
    """The Pod object the API server would hold for ``template`` scheduled on ``node``: metadata from the template,
    the node's name, the pod's IP (loopback here) and its container's port moved to ``port``."""
    spec = copy.deepcopy(template["spec"])
    spec["nodeName"] = node
    spec["containers"][0]["ports"][0]["containerPort"] = port
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                     "labels": dict(template["metadata"]["labels"]),
                     "annotations": dict(template["metadata"].get("annotations", {})),
                     "ownerReferences": [{"kind": "DaemonSet", "name": owner, "controller": True}]},
        "spec": spec,
        "status": {"phase": phase, "podIP": "127.0.0.1", "hostIP": "127.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}]},
    }  # fmt: skip


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_targets(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """What Prometheus' Kubernetes discovery (role: pod) makes of a Pod: one target per container port at
    podIP:port, with the pod's and the container port's ``__meta_kubernetes_*`` labels (discovery/kubernetes/pod.go,
    podLabels and buildPod)."""
    meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
    p = "__meta_kubernetes_pod_"
    ready = next((c["status"].lower() for c in status.get("conditions", []) if c["type"] == "Ready"), "unknown")
    labels = {
        "__meta_kubernetes_namespace": meta["namespace"], p + "name": meta["name"], p + "ip": status["podIP"],
        p + "ready": ready, p + "phase": status["phase"], p + "node_name": spec.get("nodeName", ""),
        p + "host_ip": status.get("hostIP", ""), p + "uid": meta["uid"],
    }  # fmt: skip
    for ref in meta.get("ownerReferences", []):
        if ref.get("controller"):
            labels[p + "controller_kind"], labels[p + "controller_name"] = ref["kind"], ref["name"]
    for k, v in meta.get("labels", {}).items():
        labels[p + "label_" + _sanitize(k)], labels[p + "labelpresent_" + _sanitize(k)] = v, "true"
    for k, v in meta.get("annotations", {}).items():
        labels[p + "annotation_" + _sanitize(k)], labels[p + "annotationpresent_" + _sanitize(k)] = v, "true"
    out = []
    for c in spec["containers"]:
        for port in c.get("ports", []):
            out.append({"targets": [f"{status['podIP']}:{port['containerPort']}"], "labels": {
                **labels, p + "container_name": c["name"], p + "container_port_number": str(port["containerPort"]),
                p + "container_port_name": port.get("name", ""),
                p + "container_port_protocol": port.get("protocol", "TCP"),
                p + "container_init": "false",  # (newer Prometheus also sets container_image; nothing reads it)
            }})  # fmt: skip
    return out


def container_env(pod: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet sets it: literal values, and the downward API's fieldRefs."""
    fields = {"spec.nodeName": pod["spec"]["nodeName"], "metadata.name": pod["metadata"]["name"],
              "metadata.namespace": pod["metadata"]["namespace"], "status.podIP": pod["status"]["podIP"]}
    out = {}
    for e in pod["spec"]["containers"][0].get("env", []):
        if "value" in e:
            out[e["name"]] = e["value"]
        elif "fieldRef" in e.get("valueFrom", {}):
            out[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return out


def scrape_job(pods_file: Path) -> dict[str, Any]:
    """deploy/kubernetes/prometheus-scrape.yml's job, discovery swapped for the file of pod targets, 1 s scrapes."""
    [job] = yaml.safe_load((K8S / "prometheus-scrape.yml").read_text())["scrape_configs"]
    [sd] = job.pop("kubernetes_sd_configs")
    assert sd["role"] == "pod"
    job["file_sd_configs"] = [{"files": [str(pods_file)], "refresh_interval": "1s"}]
    job.update({"scrape_interval": "1s", "scrape_timeout": "1s"})
    return job


class KubeApi:
    """The two calls of the Kubernetes API that pod discovery makes, on loopback: the namespace's PodList, then a
    watch that stays open with no change (the pods above do not change)."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.paths: list[str] = []
        self.stop = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                api.paths.append(self.path)
                path, _, query = self.path.partition("?")
                ns = path.removeprefix("/api/v1/namespaces/").removesuffix("/pods")
                if not path.endswith("/pods") or "/" in ns:
                    self.send_error(404)
                    return
                if "watch=1" in query or "watch=true" in query:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.flush()
                    api.stop.wait()
                    return
                items = [p for p in pods if p["metadata"]["namespace"] == ns]
                body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                                   "items": items}).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, name="kube-api", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Cluster:
    prometheus: str
    ports: dict[str, int]
    sims: dict[str, Proc]
    pods: dict[str, dict[str, Any]]
    targets: list[dict[str, Any]]  # the file_sd groups: what Prometheus' pod discovery yields for every pod
    victoria: str | None = None
    procs: list[Proc] = field(default_factory=list)

    def query(self, promql: str) -> list[dict[str, Any]]:
        doc = http_json(f"{self.prometheus}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
        return list(doc["data"]["result"]) if doc and doc.get("status") == "success" else []

    def status(self, node: str) -> dict[str, Any]:
        doc = http_json(f"http://127.0.0.1:{self.ports[node]}/api/v1/status")
        assert doc is not None, f"{node}: no /api/v1/status"
        return dict(doc)

    def wait(self, cond: Callable[[], Any], what: str, timeout: float = EVENT_SECONDS) -> Any:
        try:
            return wait_until(cond, what, timeout)
        except AssertionError:
            tails = "\n".join(f"--- {p.name}\n{p.log()}" for p in self.procs)
            raise AssertionError(f"timed out waiting for {what}\n{tails}") from None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("k8s")
    logs = tmp / "logs"
    logs.mkdir()
    docs = manifests()
    ds, pm = docs["DaemonSet"], docs["PodMonitor"]
    template, namespace = ds["spec"]["template"], ds["metadata"]["namespace"]
    assert pm["metadata"]["namespace"] == namespace
    ports = {n.name: free_port() for n in NODES}
    pods = {n.name: make_pod(f"gpuwatchd-{i:05d}", n.name, ports[n.name], template=template,
                             owner=ds["metadata"]["name"], namespace=namespace)
            for i, n in enumerate(NODES)}  # fmt: skip
    # Pods the job must leave alone: another app whose port is also called "metrics", a gpuwatchd pod that Failed.
    other = copy.deepcopy(template)
    other["metadata"]["labels"] = {"app.kubernetes.io/name": "other"}
    strays = [make_pod("other-0", BUSY.name, free_port(), template=other, owner="other", namespace=namespace),
              make_pod("gpuwatchd-failed", IDLE.name, free_port(), template=template, owner=ds["metadata"]["name"],
                       phase="Failed", namespace=namespace)]  # fmt: skip
    pods_file = tmp / "pods.json"
    targets = [t for pod in [*pods.values(), *strays] for t in pod_targets(pod)]
    pods_file.write_text(json.dumps(targets))
    api = KubeApi([*pods.values(), *strays])

    rules = yaml.safe_load(FLEET_RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                # A daemon is down when its scrapes fail for 20 s, not 3: on a loaded machine (a new sim starting
                # beside the others) every 1 s scrape can time out for a few seconds, and GpuwatchdDown fired for
                # every host (load ~30 on 2 cores, also at c2082ef).
                rule["for"] = "20s" if rule.get("alert") == "GpuwatchdDown" else "3s"
    (tmp / "fleet.rules.yml").write_text(yaml.safe_dump(rules))
    prom_cfg = tmp / "prometheus.yml"
    prom_cfg.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / "fleet.rules.yml")],
        "scrape_configs": [scrape_job(pods_file)],
    }))  # fmt: skip
    prom_port, vm_port = free_port(), free_port()
    c = Cluster(f"http://127.0.0.1:{prom_port}", ports, {}, pods, targets)
    try:
        if VICTORIA is not None:
            # The kit's job as written, with real Kubernetes discovery against the stand-in API.
            [job] = yaml.safe_load((K8S / "prometheus-scrape.yml").read_text())["scrape_configs"]
            job["kubernetes_sd_configs"][0]["api_server"] = api.url
            job.update({"scrape_interval": "1s", "scrape_timeout": "1s"})
            (tmp / "vm-scrape.yml").write_text(yaml.safe_dump({"scrape_configs": [job]}))
            c.victoria = f"http://127.0.0.1:{vm_port}"
            c.procs.append(spawn("victoria-metrics", [
                str(VICTORIA), f"-storageDataPath={tmp / 'vm'}", f"-httpListenAddr=127.0.0.1:{vm_port}",
                f"-promscrape.config={tmp / 'vm-scrape.yml'}", "-promscrape.kubernetesSDCheckInterval=1s",
                "-search.latencyOffset=1s", "-search.disableCache", "-loggerLevel=ERROR",
            ], logs))  # fmt: skip
        for n in NODES:
            env = {**os.environ, "PYTHONPATH": str(ROOT), **container_env(pods[n.name])}
            args = [sys.executable, "-m", "gpuwatchd", "sim", "--scenario", n.scenario, "--speed", f"{n.speed:g}",
                    "--listen", f"127.0.0.1:{ports[n.name]}", "--state-dir", str(tmp / f"state-{n.name}")]
            if n.gpus is not None:
                args += ["--gpus", str(n.gpus)]
            c.sims[n.name] = spawn(f"sim-{n.name}", args, logs, cwd=ROOT, env=env)
        c.procs.extend(c.sims.values())
        c.procs.append(spawn("prometheus", [
            str(PROMETHEUS), f"--config.file={prom_cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ], logs))  # fmt: skip

        def ready() -> bool:
            for p in c.procs:
                p.alive()
            urls = [f"{c.prometheus}/-/ready", *(f"http://127.0.0.1:{p}/healthz" for p in ports.values())]
            urls += [f"{c.victoria}/health"] if c.victoria else []
            return all(http_ok(u) for u in urls)

        c.wait(ready, "Prometheus and both pods' daemons to serve", START_SECONDS)
        yield c
    finally:
        for p in reversed(c.procs):
            p.stop()
        api.close()


NODE_NAMES = {n.name for n in NODES}


def test_up_series_carry_the_fleet_job_and_the_node_name_as_host(cluster: Cluster) -> None:
    def both_up() -> list[dict[str, Any]] | None:
        res = cluster.query("up == 1")
        return res if {r["metric"].get("host") for r in res} == NODE_NAMES else None

    up = cluster.wait(both_up, "both gpuwatchd pods up under their node's name")
    assert len(up) == 2, up  # the other app's pod and the Failed pod are not targets
    for r in up:
        m = r["metric"]
        # job="gpuwatchd": the rule's up{job="gpuwatchd"} matches; namespace/pod/container are dropped
        assert m == {"__name__": "up", "job": "gpuwatchd", "host": m["host"], "endpoint": "metrics",
                     "instance": f"127.0.0.1:{cluster.ports[m['host']]}"}, m  # fmt: skip
    assert {r["metric"]["host"] for r in cluster.query('up{job="gpuwatchd"}')} == NODE_NAMES


def test_real_kubernetes_discovery_gives_the_same_targets(cluster: Cluster) -> None:
    """VictoriaMetrics discovers the same pods from the stand-in API with the kit's job as written: its discovered
    labels are those the Prometheus test feeds through the file, and its relabelled targets are Prometheus's."""
    if cluster.victoria is None:
        pytest.skip("needs Debian's victoria-metrics (.ci/run installs it)")
    victoria = cluster.victoria

    def discovered() -> list[dict[str, Any]] | None:
        doc = http_json(f"{victoria}/api/v1/targets") or {}
        data = doc.get("data") or {}
        found = [*data.get("activeTargets", []), *data.get("droppedTargets", [])]
        return found if len(found) == len(cluster.targets) else None

    found = cluster.wait(discovered, "VictoriaMetrics to discover every pod through the Kubernetes API")
    internal = {"__address__", "__metrics_path__", "__scheme__", "__scrape_interval__", "__scrape_timeout__", "job"}
    got = {t["discoveredLabels"]["__address__"]: {k: v for k, v in t["discoveredLabels"].items() if k not in internal}
           for t in found}  # fmt: skip
    want = {t["targets"][0]: t["labels"] for t in cluster.targets}
    diff = {a: {k: (got.get(a, {}).get(k), want.get(a, {}).get(k)) for k in set(got.get(a, {})) ^ set(want.get(a, {}))
                | {k for k in set(got.get(a, {})) & set(want.get(a, {})) if got[a][k] != want[a][k]}}
            for a in set(got) | set(want)}  # fmt: skip
    assert got == want, {a: d for a, d in diff.items() if d}
    # Relabelled by the same job: the two gpuwatchd pods, labelled as Prometheus has them.
    doc = http_json(f"{victoria}/api/v1/targets") or {}
    active = [t["labels"] for t in doc["data"]["activeTargets"]]
    assert sorted(active, key=lambda x: x["host"]) == [
        {"job": "gpuwatchd", "host": n.name, "endpoint": "metrics", "instance": f"127.0.0.1:{cluster.ports[n.name]}"}
        for n in sorted(NODES, key=lambda n: n.name)]  # fmt: skip


def test_the_daemons_own_host_is_the_node_name(cluster: Cluster) -> None:
    for n in NODES:
        assert cluster.status(n.name)["daemon"]["host"] == n.name
    # The daemon's alerts carry its own host (the node's name), the target's host is the same: no exported_host.
    alerts = cluster.wait(lambda: cluster.query('gpuwatchd_alerts{alertstate="firing"}'),
                          f"{BUSY.name}'s firing alerts in Prometheus")  # fmt: skip
    assert {a["metric"]["host"] for a in alerts} == {BUSY.name}, alerts
    assert not cluster.query('count({exported_host!=""})')
    assert not cluster.query('count({job="gpuwatchd", host=""})')


def test_fleet_recording_rules_answer_by_node_name(cluster: Cluster) -> None:
    def per_host(rule: str) -> set[str]:
        return {r["metric"].get("host", "") for r in cluster.query(rule)}

    cluster.wait(lambda: per_host("host:gpuwatchd_gpus:max") == NODE_NAMES, "host:gpuwatchd_gpus:max by node")
    gpus = {r["metric"]["host"]: float(r["value"][1]) for r in cluster.query("host:gpuwatchd_gpus:max")}
    assert gpus == {BUSY.name: 1.0, IDLE.name: 2.0}
    cluster.wait(lambda: per_host("host:gpuwatchd_gpus_by_presence:count") == NODE_NAMES, "GPUs by presence by node")
    cluster.wait(lambda: BUSY.name in per_host('host:gpuwatchd_alerts_firing:count{alertname="GpuPcieLinkDegraded"}'),
                 "the firing-alert count of the busy node")  # fmt: skip


def test_every_fleet_dashboard_query_answers_by_node_name(cluster: Cluster) -> None:
    queries = dashboard_queries()
    must = {"Hosts up", "GPUs present", "GPUs by health", "Firing alerts", "PCIe links degraded", "Scrape duration",
            "Degraded GPUs", "GPUs by presence"}  # fmt: skip
    assert must <= {t for t, _ in queries}
    seen: dict[str, list[dict[str, Any]]] = {}

    def answered() -> bool:
        for title, expr in queries:
            seen[title] = cluster.query(expr)
        return all(seen[t] for t in must)

    cluster.wait(answered, "the dashboard's queries to answer")
    for title, result in seen.items():
        hosts = {r["metric"]["host"] for r in result if "host" in r["metric"]}
        assert hosts <= NODE_NAMES, (title, hosts)
    assert float(seen["Hosts up"][0]["value"][1]) == 2
    assert {r["metric"]["host"] for r in seen["Scrape duration"]} == NODE_NAMES
    assert {r["metric"]["host"] for r in seen["Firing alerts"]} >= {BUSY.name}


def test_pcie_links_degraded_lists_the_busy_low_link_not_the_idle_downshifts(cluster: Cluster) -> None:
    [expr] = [e for t, e in dashboard_queries() if t == "PCIe links degraded"]
    # The idle node's links are below their maximum generation (Gen1 of Gen4), the busy node's too (and narrower).
    for n in NODES:
        low = cluster.wait(lambda n=n: cluster.query(  # type: ignore[misc]
            f'gpuwatchd_gpu_pcie_link_generation{{host="{n.name}"}} < on(job, instance, uuid) '
            "gpuwatchd_gpu_pcie_link_max_generation"), f"{n.name}'s links read below their maximum")
        assert len(low) == (n.gpus or 1)
    rows = cluster.wait(lambda: cluster.query(expr), "the busy GPU's degraded link in the panel")
    assert [(r["metric"]["host"], r["metric"]["index"]) for r in rows] == [(BUSY.name, "0")], rows
    assert float(rows[0]["value"][1]) >= 0.5  # the column is the GPU's utilization
    # The daemon's own rule agrees on that GPU.
    cluster.wait(lambda: "GpuPcieLinkDegraded" in cluster.status(BUSY.name)["gpus"][0]["health"]["evidence"],
                 "the busy GPU's health to name GpuPcieLinkDegraded")  # fmt: skip


def test_gpus_by_health_counts_what_the_daemons_say(cluster: Cluster) -> None:
    [expr] = [e for t, e in dashboard_queries() if t == "GPUs by health"]
    last: dict[str, Any] = {}

    def agree() -> bool:
        daemons = Counter(g["health"]["state"] for n in NODES for g in cluster.status(n.name)["gpus"])
        panel = {r["metric"]["state"]: int(float(r["value"][1])) for r in cluster.query(expr)}
        last.update(daemons=dict(daemons), panel=panel)
        # the busy GPU's link alert has made it degraded: the panel must say so, as the daemon does
        return panel == dict(daemons) and panel.get("degraded") == 1

    try:
        wait_until(agree, "the health panel to count what /api/v1/status says", EVENT_SECONDS)
    except AssertionError:
        raise AssertionError(f"panel and daemons disagree: {last}") from None


def test_gpuwatchd_down_fires_for_the_killed_node_with_the_kits_up_series(cluster: Cluster) -> None:
    cluster.sims[IDLE.name].stop(signal.SIGKILL)

    def fired() -> list[dict[str, Any]] | None:
        return cluster.query('ALERTS{alertname="GpuwatchdDown", alertstate="firing"}') or None

    [alert] = cluster.wait(fired, "GpuwatchdDown for the killed node")
    assert alert["metric"]["host"] == IDLE.name and alert["metric"]["severity"] == "critical"
    assert alert["metric"]["job"] == "gpuwatchd"
    # The busy node stays up: its daemon is not reported down.
    assert {r["metric"]["host"] for r in cluster.query('up{job="gpuwatchd"} == 1')} == {BUSY.name}
