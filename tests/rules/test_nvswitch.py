"""``NvSwitchError``: SXid lines (real ones, tests/fixtures/kmsg/sxid.log) through the kernel-log ingest into the
store, judged per switch: critical when a fatal one is within the window, warning for non-fatal, resolved after a
quiet window; nothing on a host without NVSwitch lines."""

from __future__ import annotations

from pathlib import Path

from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.sources.kmsg.ingest import KernelLogIngest
from gpuwatchd.sources.kmsg.parse import KmsgRecord
from gpuwatchd.store import Store

FIXTURE = Path(__file__).parents[1] / "fixtures" / "kmsg" / "sxid.log"
T0 = 1_700_000_000.0


def _feed(ingest: KernelLogIngest, t: float, switch_bus: str) -> None:
    for seq, line in enumerate(FIXTURE.read_text().splitlines()):
        if line and not line.startswith("#") and switch_bus in line:
            ingest.apply(KmsgRecord(seq=seq, usec=seq, level=3, facility=0, message=line), t)


def test_fatal_is_critical_non_fatal_warning_and_both_resolve() -> None:
    store = Store()
    ingest = KernelLogIngest(store)
    eng = RulesEngine(RulesConfig(), host="hgx")
    _feed(ingest, T0, "0000:02:00.0")  # two non-fatal 22013
    _feed(ingest, T0, "0000:c3:00.0")  # 20009, 28006 non-fatal, 24007 fatal
    alerts = {a.labels["switch"]: a for a in eng.evaluate(store, T0 + 1) if a.name == "NvSwitchError"}
    assert {s: (a.state, a.severity) for s, a in alerts.items()} == {
        "00000000:02:00.0": ("firing", "warning"), "00000000:C3:00.0": ("firing", "critical")}
    assert alerts["00000000:C3:00.0"].summary == (
        "NVSwitch 00000000:C3:00.0: 3 SXid error(s) (1 fatal), codes 20009, 24007, 28006")
    later = {a.labels["switch"]: a for a in eng.evaluate(store, T0 + 700) if a.name == "NvSwitchError"}
    assert {s: a.state for s, a in later.items()} == {"00000000:02:00.0": "resolved", "00000000:C3:00.0": "resolved"}


def test_no_sxid_no_alert() -> None:
    store = Store()
    KernelLogIngest(store)
    assert RulesEngine(RulesConfig(), host="pc").evaluate(store, T0) == []
