"""rules/advice.py: one advice per fault, from the alert kind or the Xid catalog entry plus the evidence; never a raw
catalog code; short enough to print whole."""

from __future__ import annotations

import re

import pytest

from gpuwatchd.gpu import xid_catalog
from gpuwatchd.gpu.health import GpuFacts, assess, health_actions
from gpuwatchd.model import Alert
from gpuwatchd.rules import advice
from gpuwatchd.rules.condition import Condition
from gpuwatchd.runtime.terminal import MAX_CHARS

RAW = re.compile(r"\b(" + "|".join(re.escape(k) for k in xid_catalog.BUCKET_TEXT) + r")\b")
UUID = "GPU-a"


def _alert(name: str, action: str, *, state: str = "firing", **labels: str) -> Alert:
    return Alert(name=name, severity="critical", labels={"alertname": name, "uuid": UUID, **labels}, summary=name,
                 description="", state=state, active_at=0.0, fired_at=0.0,  # type: ignore[arg-type]
                 annotations={advice.ACTION: action})


@pytest.mark.parametrize("code", [*sorted(xid_catalog.catalog().entries), 9999])
def test_every_xid_has_words_never_a_raw_code(code: int) -> None:
    for egpu in (False, True):
        text = advice.xid(code, egpu=egpu, index=3)
        assert text and not RAW.search(text), (code, text)
        assert "<index>" not in text and len(text) <= MAX_CHARS


def test_an_unknown_bucket_is_not_shown_as_advice() -> None:
    assert xid_catalog.bucket_text("RESTART_SOMETHING_NEW") == ""
    assert xid_catalog.bucket_text("RESTART_BM") == "reboot the machine"


def test_xid_79_follows_the_evidence() -> None:
    internal = advice.xid(79)
    docked = advice.xid(79, egpu=True)
    assert internal.startswith("Reboot the machine") and "Thunderbolt" not in internal
    assert "re-plug the dock" in docked
    assert advice.xid(79, egpu=True, reattached=True) == advice.XID_REATTACHED


def test_dock_advice_follows_its_security_level() -> None:
    user = advice.dock_unauthorized("uid-1", "user")
    assert user.startswith("Authorize the dock: boltctl enroll uid-1") and "BIOS" not in user
    dponly = advice.dock_unauthorized("uid-1", "dponly")
    assert "BIOS/UEFI to 'user' (it is 'dponly'" in dponly and "boltctl enroll uid-1" in dponly
    assert "re-plug it" in advice.dock_unauthorized("uid-1", "none")
    assert "key is checked" in advice.dock_unauthorized("uid-1", "secure")


def test_every_text_fits_a_terminal_line_cap() -> None:
    texts = [*advice.BY_ALERT.values(), *advice.LEAK.values(), *advice.THROTTLE.values(), advice.REPLUG_DOCK,
             advice.LOST_DOCKED, advice.LOST, advice.REMOVED, advice.DOCK_LINK, advice.ECC_DBE,
             advice.dock_unauthorized("c6030000-0062-0c0e-8328-a0e1c2a5f30b", "user"),
             advice.dock_unauthorized("c6030000-0062-0c0e-8328-a0e1c2a5f30b", "dponly")]
    assert all(len(t) <= MAX_CHARS and not RAW.search(t) for t in texts)


def test_a_condition_gets_its_alertname_advice_unless_its_rule_gave_one() -> None:
    c = Condition("GpuTemperatureHigh", "warning", {"gpu": "2"}, "s", "d")
    assert c.annotations[advice.ACTION] == advice.BY_ALERT["GpuTemperatureHigh"]
    nv = Condition("GpuNvlinkErrors", "warning", {"gpu": "2"}, "s", "d")
    assert "nvidia-smi nvlink -e -i 2" in nv.annotations[advice.ACTION]
    own = Condition("GpuTemperatureHigh", "warning", {}, "s", "d", annotations={advice.ACTION: "x"})
    assert own.annotations[advice.ACTION] == "x"
    note = Condition("GpuTemperatureHigh", "warning", {}, "s", "d", level="clear")
    assert advice.ACTION not in note.annotations  # a resolution says what happened, not what to do


def test_an_xid_takes_the_advice_of_the_alert_that_speaks_for_its_gpu() -> None:
    xid = _alert("GpuXidError", "xid words", xid="79")
    removed = _alert("GpuRemoved", advice.REPLUG_DOCK)
    assert advice.for_xid([xid], UUID, 79, egpu=True, reattached=False, index=0) == "xid words"
    assert advice.for_xid([xid, removed], UUID, 79, egpu=True, reattached=False, index=0) == advice.REPLUG_DOCK
    # No alert about it any more: its own words for the evidence now.
    assert advice.for_xid([], UUID, 79, egpu=True, reattached=True, index=0) == advice.XID_REATTACHED


def test_health_gives_the_advice_of_the_alert_it_rests_on() -> None:
    facts = {UUID: GpuFacts(presence="removed", has_sample=False, egpu=True, dock_id="uid-1")}
    alerts = [_alert("GpuXidError", advice.xid(79, egpu=True), xid="79"),
              _alert("GpuRemoved", advice.REPLUG_DOCK)]
    h = assess(facts, alerts, 1.0, {}, nvml_ok=True, xid_actions=health_actions())[UUID]
    # The removal speaks for the GPU (its Xid 79 follows from it and is inhibited in chat): the same advice.
    assert h.evidence == ("GpuRemoved",) and h.as_dict()["action_text"] == advice.REPLUG_DOCK
    alone = assess(facts, alerts[:1], 1.0, {}, nvml_ok=True, xid_actions=health_actions())[UUID]
    assert alone.as_dict()["action_text"] == advice.xid(79, egpu=True)
