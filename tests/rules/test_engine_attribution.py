"""Issue 28: an alert's identity is the fault (GPU, process), never its owner. Owner facts (the process' name, its
container, pod, Slurm job) that arrive or change after the alert started follow its labels while it is pending,
are frozen into them when it fires, and are kept current in its annotations; the alert stays one alert (one
fingerprint) from pending to resolved, through the real leak family too."""

from __future__ import annotations

from collections.abc import Mapping

from gpuwatchd.config.types import validate
from gpuwatchd.model import Alert, Attribution, ProcessOwner, ProcessSample
from gpuwatchd.rules.condition import Condition, Level, RuleView
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import FamilySpec, RulesEngine
from gpuwatchd.store import Store

from .conftest import T0, UUID, gpu, snap, with_processes

MIB = 1024**2


class Owned:
    """A process alert whose owner facts the test changes between evaluations."""

    def __init__(self) -> None:
        self.level: Level | None = None
        self.owner: dict[str, str] = {}

    def __call__(self, view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
        if self.level is None:
            return []
        who = f" in pod {self.owner['namespace']}/{self.owner['pod']}" if "pod" in self.owner else ""
        return [Condition("GpuMemoryLeak", "warning", {"uuid": UUID, "gpu": "0", "model": "NVIDIA A10G",
                                                       "pid": "4242", "kind": "gpu"},
                          f"python[4242]{who} grows", "d", level=self.level,
                          attribution={"process": "python", **self.owner}, annotations=dict(self.owner))]


def make(for_: str = "60s") -> tuple[RulesEngine, Owned]:
    fam = Owned()
    spec = FamilySpec("owned", fam, {"GpuMemoryLeak": lambda c: c.leak})
    cfg = validate(RulesConfig, {"leak": {"for": for_, "keep_firing_for": "0s"}})
    return RulesEngine(cfg, host="node1", families=(spec,)), fam


def one(alerts: list[Alert]) -> Alert:
    assert len(alerts) == 1, [(a.labels, a.state) for a in alerts]
    return alerts[0]


POD = {"container_id": "8d1e4b2a9f3c", "namespace": "ml", "pod": "trainer-0", "container": "trainer"}


def test_owner_learnt_after_firing_enriches_annotations_and_words_never_labels() -> None:
    eng, fam = make()
    store = Store()
    fam.level, fam.owner = "raise", {"container_id": "8d1e4b2a9f3c"}
    pending = one(eng.evaluate(store, T0))
    fired = one(eng.evaluate(store, T0 + 60))
    assert (pending.state, fired.state) == ("pending", "firing")
    frozen = dict(fired.labels)
    assert frozen["container_id"] == "8d1e4b2a9f3c" and "pod" not in frozen and frozen["process"] == "python"
    fam.owner = dict(POD)  # the kubelet answers late
    late = one(eng.evaluate(store, T0 + 70))
    assert late.state == "firing" and late.labels == frozen and late.fingerprint == fired.fingerprint
    assert late.fired_at == fired.fired_at and late.active_at == T0
    assert {k: late.annotations[k] for k in POD} == POD
    assert "in pod ml/trainer-0" in late.summary
    fam.level = None
    gone = one(eng.evaluate(store, T0 + 80))
    assert gone.state == "resolved" and gone.labels == frozen and gone.annotations["pod"] == "trainer-0"


def test_a_pod_label_that_changes_while_firing_keeps_the_alert() -> None:
    eng, fam = make("0s")
    store = Store()
    fam.level, fam.owner = "raise", dict(POD)
    first = one(eng.evaluate(store, T0))
    assert first.state == "firing" and first.labels["pod"] == "trainer-0"
    changes = eng.changes
    fam.owner = {**POD, "pod": "trainer-1"}  # the owner's pod as another source tells it
    again = one(eng.evaluate(store, T0 + 10))
    assert again.labels == first.labels and again.labels["pod"] == "trainer-0"  # frozen: what receivers know
    assert again.annotations["pod"] == "trainer-1"  # current
    assert eng.changes == changes  # no alert came, went or changed state
    fam.owner = {"container_id": "8d1e4b2a9f3c"}  # and facts that vanish (a kubelet outage) do not fork it either
    assert one(eng.evaluate(store, T0 + 20)).labels == first.labels


def test_a_pending_alert_takes_the_owner_known_when_it_fires() -> None:
    eng, fam = make()
    store = Store()
    fam.level = "raise"
    assert "pod" not in one(eng.evaluate(store, T0)).labels
    fam.owner = dict(POD)
    pending = one(eng.evaluate(store, T0 + 30))
    assert pending.state == "pending" and pending.labels["pod"] == "trainer-0" and pending.active_at == T0
    fired = one(eng.evaluate(store, T0 + 60))
    assert fired.state == "firing" and {k: fired.labels[k] for k in POD} == POD


def test_the_same_pid_with_another_owner_after_resolution_is_a_new_alert() -> None:
    eng, fam = make("0s")
    store = Store()
    fam.level, fam.owner = "raise", dict(POD)
    a = one(eng.evaluate(store, T0))
    fam.level = None
    eng.evaluate(store, T0 + 10)
    fam.level, fam.owner = "raise", {**POD, "pod": "trainer-1"}
    b = one(eng.evaluate(store, T0 + 20))  # a new episode in the resolved one's place, as for any alert
    assert b.state == "firing" and b.active_at == T0 + 20
    assert b.labels["pod"] == "trainer-1" and b.fingerprint != a.fingerprint


def _owners(owner: ProcessOwner | None) -> Attribution:
    return Attribution(timestamp=0.0, owners={(UUID, 4242): owner} if owner is not None else {})


def _leak_step(store: Store, t: float, used: int) -> None:
    proc = ProcessSample(pid=4242, name="python", used_memory_bytes=used)
    store.apply(snap(t, with_processes(gpu(), [proc])))


def test_the_leak_family_keeps_one_alert_when_the_pod_arrives_after_it_fired() -> None:
    """The real leak family on a steady 40 MiB/min leak; the pod is learnt once the alert fired."""
    store = Store()
    eng = RulesEngine(validate(RulesConfig, {}), host="node1")
    seen: dict[str, Mapping[str, str]] = {}
    late = False
    fired_at = None
    t = T0
    for i in range(0, 60 * 30, 10):
        t = T0 + i
        _leak_step(store, t, 2048 * MIB + int(i / 60 * 40 * MIB))
        owner = ProcessOwner(container_id="8d1e4b2a9f3c", runtime="containerd")
        if late:
            owner = ProcessOwner(container_id="8d1e4b2a9f3c", runtime="containerd", namespace="ml",
                                 pod="trainer-0", container="trainer")
        store.set_attribution(_owners(owner))
        for a in eng.evaluate(store, t):
            if a.name == "GpuMemoryLeak" and a.state != "pending":
                seen[a.fingerprint] = a.labels
                if fired_at is None:
                    fired_at = t
        late = late or fired_at is not None
    assert fired_at is not None, "the leak never fired"
    assert len(seen) == 1, seen
    (labels,) = seen.values()
    assert "pod" not in labels and labels["container_id"] == "8d1e4b2a9f3c" and labels["pid"] == "4242"
    (a,) = [x for x in eng.alerts() if x.name == "GpuMemoryLeak"]
    assert a.state == "firing" and a.annotations["pod"] == "trainer-0"
    assert "python[4242] in pod ml/trainer-0 container trainer grows" in a.summary
