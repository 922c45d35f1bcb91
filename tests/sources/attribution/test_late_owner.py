"""Issue 28 end to end: one fault, one alert, even when its owner is learnt late or changes.

The stand-in driver plays ``tests/fixtures/scenarios/late-owner-leak.yml``: pid 4242 leaks in pod ml/trainer-0,
whose pod only the kubelet knows, and the real gRPC kubelet holds its ``List`` answer until the leak has fired;
pid 7301, a host process of batch job 100 (the HPC job-mapping directory), leaks later, and the mapping is
rewritten to job 200 once that alert fired. Both jobs stop, both alerts resolve. Through the real NVML worker,
attribution, store, rules engine and dispatcher to real local HTTP sinks (every chat service, a webhook, an
Alertmanager API): per leak exactly one alert, two messages per chat receiver (firing, resolved), one label set
everywhere, and the owner learnt late in the annotations and the resolved message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpuwatchd.config.attribution import AttributionConfig
from gpuwatchd.config.types import validate
from gpuwatchd.model import Alert
from gpuwatchd.sources.attribution.task import AttributionTask
from tests.notify.scenario_harness import SERVICES, message_text
from tests.notify.scenario_replay import NvmlChild, Replay, replay
from tests.sources.attribution.kubelet_server import serve
from tests.until import until

SCENARIO = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios" / "late-owner-leak.yml"
G0 = "GPU-0a7c5d1e-1111-4c6d-8e9f-0a1b2c3d4e50"
G1 = "GPU-1b8d6e2f-2222-4c6d-8e9f-0a1b2c3d4e51"
KUBELET = {("ml", "trainer-0"): {"trainer": [("nvidia.com/gpu", [G0])]}}
POD = {"namespace": "ml", "pod": "trainer-0", "container": "trainer"}
CHAT = tuple(s for s in SERVICES if s != "webhook")


class Run:
    def __init__(self, result: Replay, fingerprints: dict[str, set[str]], events: dict[str, float]) -> None:
        self.result = result
        self.fingerprints = fingerprints  # pid -> every fingerprint the engine reported for its leak alert
        self.events = events  # what the test did, at which scenario time


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    from gpuwatchd.sim.build import build_standin

    tmp = tmp_path_factory.mktemp("late-owner")
    jobs = tmp / "jobs"
    jobs.mkdir()
    (jobs / "1").write_text("100\n")
    cfg = validate(AttributionConfig, {
        "proc_root": str(tmp / "sysfs" / "proc"), "host_root": str(tmp / "host"), "hpc_job_mapping_dir": str(jobs),
        # a long deadline: the held List stays in flight (one that times out is asked again, and held again)
        "kubernetes": {"pod_resources_socket": str(tmp / "kubelet.sock"), "timeout": 60.0, "interval": 0.2}})
    task = AttributionTask(cfg)
    fingerprints: dict[str, set[str]] = {"4242": set(), "7301": set()}
    events: dict[str, float] = {}

    child = NvmlChild(build_standin())
    try:
        with serve(tmp / "kubelet.sock", KUBELET) as kubelet:
            # Before the run: the kubelet is down (the job mapping is read, no pod is known) ...
            kubelet.fail = grpc.StatusCode.UNAVAILABLE
            asyncio.run(task.refresh())
            assert task.errors["kubernetes"] == 1 and task.jobs == {1: ("100",)} and not task.pods
            # ... then up, but answering only when the test lets it.
            kubelet.fail = None
            kubelet.gate.clear()

            async def on_step(t: float, alerts: list[Alert]) -> None:
                firing = set()
                for a in alerts:
                    if a.name == "GpuMemoryLeak" and a.labels.get("pid") in fingerprints:
                        fingerprints[a.labels["pid"]].add(a.fingerprint)
                        if a.state == "firing":
                            firing.add(a.labels["pid"])
                if "4242" in firing and "kubelet" not in events:
                    events["kubelet"] = t
                    kubelet.gate.set()  # the held answer goes out now, after the alert fired
                    await until(lambda: task.pods, "the kubelet's late answer")
                if "7301" in firing and "job" not in events:
                    events["job"] = t
                    (jobs / "1").write_text("200\n")
                    await until(lambda: task.jobs.get(1) == ("200",), "the rewritten job mapping")

            result = asyncio.run(replay(str(SCENARIO), child, tmp, step=10.0, tail=0.0, rules={},
                                        attribution=task, attribution_loop=True, alertmanager=True,
                                        on_step=on_step))
    finally:
        child.close()
    yield Run(result, fingerprints, events)


def _leak(body: dict[str, Any], pid: str) -> list[dict[str, Any]]:
    return [a for a in body["alerts"] if a["labels"].get("alertname") == "GpuMemoryLeak"
            and a["labels"].get("pid") == pid]


def _webhook(run: Run, pid: str) -> list[dict[str, Any]]:
    """Every GpuMemoryLeak alert of ``pid`` in every webhook message, in order."""
    return [a for body in run.result.sinks["webhook"].bodies() for a in _leak(body, pid)]


def test_the_owner_came_after_the_alert_fired(run: Run) -> None:
    assert set(run.events) == {"kubelet", "job"}, "a leak never fired"
    # what frozen labels the alerts have depends on this order; it is the scenario's, checked here
    assert run.events["kubelet"] < run.events["job"]


@pytest.mark.parametrize("pid", ["4242", "7301"])
def test_one_alert_per_leak_from_pending_to_resolved(run: Run, pid: str) -> None:
    assert len(run.fingerprints[pid]) == 1, run.fingerprints[pid]
    alerts = _webhook(run, pid)
    assert [a["status"] for a in alerts] == ["firing", "resolved"]
    assert len({a["fingerprint"] for a in alerts}) == 1
    assert alerts[0]["labels"] == alerts[1]["labels"]


@pytest.mark.parametrize("service", CHAT)
def test_two_chat_messages_per_leak_firing_then_resolved(run: Run, service: str) -> None:
    texts = [message_text(b, service) for b in run.result.sinks[service].bodies()]
    for uuid in (G0, G1):
        mine = [t for t in texts if uuid[:12] in t and "GpuMemoryLeak" in t]
        assert len(mine) == 2, (uuid, mine)
        assert "FIRING" in mine[0] and "RESOLVED" in mine[1]
    assert len(texts) == 4, texts  # nothing else


def test_the_pod_learnt_late_enriches_annotations_and_the_resolved_message_not_the_labels(run: Run) -> None:
    firing, resolved = _webhook(run, "4242")
    # labels: what was known when it fired (the container, from its cgroup), kept to the end
    assert firing["labels"]["container_id"] == "8d1e4b2a9f3c" and "pod" not in firing["labels"]
    assert "pod" not in firing["annotations"]
    assert {k: resolved["annotations"][k] for k in POD} == POD
    slack = [message_text(b, "slack") for b in run.result.sinks["slack"].bodies() if G0[:12] in str(b)]
    assert "Owner: container 8d1e4b2a9f3c" in slack[0]
    assert "Owner: pod ml/trainer-0 container trainer" in slack[1]


def test_a_job_that_changes_after_firing_keeps_the_label_and_tells_the_new_one(run: Run) -> None:
    firing, resolved = _webhook(run, "7301")
    assert firing["labels"]["hpc_job"] == "100" and resolved["labels"]["hpc_job"] == "100"
    assert resolved["annotations"]["hpc_job"] == "200"
    slack = [message_text(b, "slack") for b in run.result.sinks["slack"].bodies() if G1[:12] in str(b)]
    assert "Owner: job 100" in slack[0] and "Owner: job 200" in slack[1]


def test_alertmanager_gets_one_label_set_per_leak_to_its_resolution(run: Run) -> None:
    posts = run.result.sinks["alertmanager"].bodies()
    for pid in ("4242", "7301"):
        alerts = [a for body in posts for a in body if a["labels"].get("alertname") == "GpuMemoryLeak"
                  and a["labels"].get("pid") == pid]
        assert len(alerts) >= 2
        assert len({tuple(sorted(a["labels"].items())) for a in alerts}) == 1, pid
    late = [a for body in posts for a in body if a["labels"].get("pid") == "4242"][-1]
    assert late["annotations"]["pod"] == "trainer-0" and "pod" not in late["labels"]
