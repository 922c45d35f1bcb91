"""GpuXidError and GpuXidRepeated hold a bounded number of alerts whatever a kernel log names: GPUs NVML does not list
past a few are one unknown GPU, and the (GPU, code) pairs past the cap are one summarising alert (issue 34)."""

from __future__ import annotations

from gpuwatchd.config.types import validate
from gpuwatchd.model import XidEvent
from gpuwatchd.rules import xid as xid_rule
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.store import Store

from .conftest import T0, UUID, gpu, snap


def _engine() -> RulesEngine:
    return RulesEngine(validate(RulesConfig, {"xid": {"resolve_after": "1h"}}), host="node1")


def _forged(i: int) -> str:
    return f"GPU-{i:08x}-0000-4000-8000-000000000000"


def _kmsg(store: Store, uuid: str | None, code: int, t: float, bus: str | None = None) -> None:
    store.ingest(XidEvent(uuid, code, t, "kmsg", bus, "forged"))


def test_a_few_unlisted_gpus_keep_their_own_alerts(store: Store) -> None:
    store.apply(snap(T0, gpu()))
    for i in range(xid_rule.MAX_UNLISTED_GPUS):
        _kmsg(store, _forged(i), 13, T0 + 1)
    alerts = [a for a in _engine().evaluate(store, T0 + 2) if a.name == xid_rule.NAME]
    assert {a.labels["uuid"] for a in alerts} == {_forged(i) for i in range(xid_rule.MAX_UNLISTED_GPUS)}


def test_a_flood_of_unlisted_gpus_is_one_unknown_gpu_and_the_listed_one_keeps_its_alert(store: Store) -> None:
    store.apply(snap(T0, gpu()))
    eng = _engine()
    seen: set[str] = set()
    # Rotating through far more UUIDs than the store keeps events: every evaluation sees a different set.
    for turn in range(20):
        for i in range(200):
            _kmsg(store, _forged(turn * 200 + i), 31, T0 + turn)
        _kmsg(store, UUID, 48, T0 + turn)
        alerts = [a for a in eng.evaluate(store, T0 + turn + 0.5) if a.name == xid_rule.NAME]
        seen |= {a.fingerprint for a in alerts}
        by = {(a.labels["uuid"], a.labels["xid"]) for a in alerts}
        assert (UUID, "48") in by
        assert ("unknown", "31") in by
        assert len(alerts) <= xid_rule.MAX_XID_ALERTS
    # Not one alert per forged GPU ever: the engine tracked a handful of identities in all.
    assert len(seen) <= 4, len(seen)


def test_more_pairs_than_the_cap_are_one_summarising_alert(store: Store) -> None:
    store.apply(snap(T0, gpu()))
    # Every code on the listed GPU and on unlisted addresses: 2 x 100 pairs.
    for code in range(1, 101):
        _kmsg(store, UUID, code, T0 + 1)
        _kmsg(store, None, code, T0 + 1, bus="0000:99:00")
    alerts = [a for a in _engine().evaluate(store, T0 + 2) if a.name == xid_rule.NAME]
    assert len(alerts) == xid_rule.MAX_XID_ALERTS
    summary = [a for a in alerts if a.labels["xid"] == xid_rule.OTHER]
    assert len(summary) == 1
    assert summary[0].value == 200 - (xid_rule.MAX_XID_ALERTS - 1)
    assert "more (GPU, Xid) pairs" in summary[0].summary and summary[0].severity == "critical"
    # The listed GPU's pairs come first: every named alert is on it.
    assert {a.labels["uuid"] for a in alerts if a.labels["xid"] != xid_rule.OTHER} == {UUID}
