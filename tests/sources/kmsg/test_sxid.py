"""NVSwitch SXid lines (real ones from public reports: tests/fixtures/kmsg/sxid.log) through the kernel-log parser,
the ingest and the exporter: one count per error headline, its Severity / Data lines not counted again, fatal ones
counted apart, per switch (its PCI address) and code."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatchd.exporter.kernel_log_families import kernel_log_families
from gpuwatchd.gpu.sxid_catalog import SXID_CATALOG, sxid_name
from gpuwatchd.sources.kmsg import parse as kp
from gpuwatchd.sources.kmsg.ingest import KernelLogIngest
from gpuwatchd.sources.kmsg.parse import KmsgRecord
from gpuwatchd.store import Store

FIXTURE = Path(__file__).parents[2] / "fixtures" / "kmsg" / "sxid.log"


def lines() -> list[str]:
    return [x for x in FIXTURE.read_text().splitlines() if x and not x.startswith("#")]


def test_real_lines_parse() -> None:
    events = [kp.classify(x) for x in lines()]
    heads = [e for e in events if isinstance(e, kp.Sxid)]
    assert [(e.switch, e.code, e.fatal) for e in heads] == [
        ("00000000:02:00.0", 22013, False),
        ("00000000:02:00.0", 22013, False),
        ("00000000:C3:00.0", 20009, False),
        ("00000000:C3:00.0", 28006, False),
        ("00000000:C3:00.0", 24007, True),
        ("00000000:05:00.0", 12028, False),
        ("00000000:00:00.0", 11001, True),
    ]
    assert heads[0].text == "Non-fatal, Link 00 Minion Link DLREQ interrupt"
    details = [e for e in events if isinstance(e, kp.SxidDetail)]
    assert [(d.switch, d.code) for d in details] == [("00000000:02:00.0", 22013)] * 3 + [("00000000:84:00.0", 12028)]
    assert events[:2] == [None, None]  # the driver's probe lines are not errors
    assert {kp.kind_of(e) for e in events[2:]} == {"sxid"}
    # every code of the fixture is in the catalog, with the line's own severity
    assert all(SXID_CATALOG[e.code].fatal == e.fatal for e in heads)
    assert sxid_name(99999) == "SXid 99999"


@pytest.mark.parametrize("line", [
    "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): garbled, Fatal",
    "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 123456, Fatal, too many digits",
    "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 00000, Fatal, zero",
    "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): \u0661\u0662\u0660\u0662\u0668, Fatal, Arabic-Indic digits",
])
def test_a_code_that_is_not_a_number_is_malformed(line: str) -> None:
    assert isinstance(kp.classify(line), kp.Malformed)


def test_counts_per_switch_and_code_and_history_is_not_counted() -> None:
    store = Store()
    ingest = KernelLogIngest(store)
    ingest.apply(KmsgRecord(seq=0, usec=0, level=3, facility=0, message=lines()[2]), 1.0, history=True)
    for seq, line in enumerate(lines(), start=1):
        ingest.apply(KmsgRecord(seq=seq, usec=seq, level=3, facility=0, message=line), 2.0)
    stats = ingest.stats
    assert stats.sxid == {
        ("00000000:02:00.0", "22013"): 2, ("00000000:C3:00.0", "20009"): 1, ("00000000:C3:00.0", "28006"): 1,
        ("00000000:C3:00.0", "24007"): 1, ("00000000:05:00.0", "12028"): 1, ("00000000:00:00.0", "11001"): 1,
    }
    assert stats.sxid_fatal == {("00000000:C3:00.0", "24007"): 1, ("00000000:00:00.0", "11001"): 1}
    assert stats.lines["sxid"] == 12  # headlines and their detail lines (and the history one)
    fams = {m.name: m for m in kernel_log_families(store)}
    sxid = {(s.labels["switch"], s.labels["sxid"]): s.value
            for s in fams["gpuwatchd_nvswitch_sxid_errors"].samples if s.name.endswith("_total")}
    assert sxid[("00000000:02:00.0", "22013")] == 2
    fatal = fams["gpuwatchd_nvswitch_sxid_fatal_errors"].samples
    assert sorted(s.labels["sxid"] for s in fatal if s.name.endswith("_total")) == ["11001", "24007"]


def test_no_switch_no_series() -> None:
    store = Store()
    ingest = KernelLogIngest(store)
    ingest.apply(KmsgRecord(seq=1, usec=1, level=3, facility=0,
                            message="NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus."), 2.0)
    names = {m.name for m in kernel_log_families(store)}
    assert not {n for n in names if "nvswitch" in n}
