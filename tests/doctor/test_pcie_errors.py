"""doctor's PCIe errors line and the daemon's firing alerts (issue 28 part 4): the replay rate over doctor's window
against DCGM's allowance, the AER counters in sysfs (the kernel's aer_dev_* files), and what the daemon judged over
time. The real sim tree and a scenario whose counters move while doctor runs, then stop."""

from __future__ import annotations

import threading
from pathlib import Path

from gpuwatchd.doctor.daemon import firing_alerts
from gpuwatchd.doctor.pcie_errors import check_pcie_errors
from gpuwatchd.doctor.run import run_checks
from gpuwatchd.sim.pci_tree import aer_files, mirror_sysfs
from gpuwatchd.sim.player import state_at
from gpuwatchd.sim.scenario import load_scenario
from gpuwatchd.sim.state import write_state
from gpuwatchd.sources.sysfs.aer import AerCounts, parse, read_aer

from .conftest import SimHost

GEN3X4 = {"index": 0, "pci_bus_id": "00000000:07:00.0", "pcie_gen": 3, "pcie_width": 4, "pcie_replay_counter": 500}
CLEAN = AerCounts(3, 0, 0)


def test_replays_within_the_links_allowance_pass_above_it_warn() -> None:
    # gen3 x4: ceil(0.48 x 4) = 2 a minute; over 2 s that allows 0.07, so one replay in 2 s is too many
    r = check_pcie_errors("gpu 0", GEN3X4, (0, 2.0), {}, {})
    assert r.status == "pass" and "0 replays in 2 s (allowed 2/min)" in r.detail and "500 replays since" in r.detail
    r = check_pcie_errors("gpu 0", GEN3X4, (1, 2.0), {}, {})
    assert r.status == "warn" and "1 PCIe replays in 2 s (~30/min; a gen3 x4 link allows 2/min)" in r.detail
    wide = {**GEN3X4, "pcie_gen": 4, "pcie_width": 16}  # ceil(0.96 x 16) = 16 a minute
    assert check_pcie_errors("gpu 0", wide, (16, 60.0), {}, {}).status == "pass"
    assert check_pcie_errors("gpu 0", wide, (17, 60.0), {}, {}).status == "warn"
    # a counter that went back (a GPU reset between the reads) says nothing about a rate
    assert check_pcie_errors("gpu 0", GEN3X4, (-400, 2.0), {}, {}).status == "pass"


def test_aer_counters() -> None:
    bdf = "0000:07:00.0"
    r = check_pcie_errors("gpu 0", GEN3X4, (0, 2.0), {bdf: CLEAN}, {bdf: CLEAN})
    assert r.status == "pass" and "AER: 3 correctable, 0 non-fatal, 0 fatal since boot" in r.detail
    rising = AerCounts(7, 0, 0, {"correctable": {"BadTLP": 5, "RxErr": 2}})
    r = check_pcie_errors("gpu 0", GEN3X4, (0, 2.0), {bdf: CLEAN}, {bdf: rising})
    assert r.status == "warn" and "correctable PCIe (AER) errors rising: +4 during the check, 7 since boot " \
        "(BadTLP 5, RxErr 2)" in r.detail
    nonfatal = AerCounts(3, 1, 0, {"nonfatal": {"DLP": 1}})
    assert check_pcie_errors("gpu 0", GEN3X4, None, {bdf: nonfatal}, {bdf: nonfatal}).status == "warn"
    fatal = AerCounts(3, 0, 2, {"fatal": {"DLP": 2}})
    r = check_pcie_errors("gpu 0", GEN3X4, None, {bdf: fatal}, {bdf: fatal})
    assert r.status == "fail" and "2 fatal PCIe (AER) errors since boot (DLP 2)" in r.detail
    r = check_pcie_errors("gpu 0", GEN3X4, None, {}, {})
    assert r.status == "pass" and "no AER counters in sysfs" in r.detail


def test_aer_files_as_the_kernel_writes_them(tmp_path: Path) -> None:
    assert parse("RxErr 0\nBadTLP 3\nTOTAL_ERR_COR 3\n") == {"RxErr": 0, "BadTLP": 3, "TOTAL_ERR_COR": 3}
    for name, text in aer_files({"pcie_correctable_errors": 9, "pcie_bad_tlp": 6, "pcie_non_fatal_errors": 1}).items():
        (tmp_path / name).write_text(text)
    c = read_aer(tmp_path)
    assert c is not None and (c.correctable, c.nonfatal, c.fatal) == (9, 1, 0)
    assert c.names == {"correctable": {"BadTLP": 6}, "nonfatal": {"DLP": 1}}
    (tmp_path / "aer_dev_fatal").unlink()  # a kernel or device without AER stats: unknown, not zero
    assert read_aer(tmp_path) is None


def _alert(name: str, severity: str, state: str = "firing", muted: bool = False) -> dict[str, object]:
    return {"labels": {"alertname": name, "severity": severity}, "state": state,
            "annotations": {"summary": f"{name} now", "description": f"what to do about {name}"},
            "status": {"state": "suppressed" if muted else "active"}}


def test_the_daemons_firing_alerts() -> None:
    assert firing_alerts([]).status == "pass"
    assert firing_alerts([_alert("GpuPcieReplays", "warning", "resolved")]).status == "pass"
    r = firing_alerts([_alert("GpuPcieReplays", "warning", muted=True)])
    assert r.status == "pass" and "1 silenced or inhibited" in r.detail
    r = firing_alerts([_alert("GpuPcieReplays", "warning"), _alert("GpuLost", "critical"),
                       _alert("GpuMemoryLeak", "warning", "pending")])
    assert r.status == "fail" and r.detail.startswith("2 firing: GpuLost (critical): GpuLost now; GpuPcieReplays")
    assert r.fix.startswith("GpuLost: what to do about GpuLost")


def test_flaky_cable_while_doctor_runs_and_after_the_cable_is_replaced(sim_host: SimHost, tmp_path: Path) -> None:
    """The stand-in's counters and the sim's sysfs tree advance while doctor runs (time passing at speed 1, as under
    `gpuwatchd sim`): replays and AER errors rise during its window; once the cable is replaced they stop."""
    scen = load_scenario("egpu-flaky-cable")
    for t, want in ((120.0, "warn"), (400.0, "pass")):
        host = sim_host("egpu-flaky-cable", t)
        stop = threading.Event()

        def advance(t0: float = t, stop: threading.Event = stop) -> None:
            k = 0
            while not stop.wait(0.05):
                k += 1
                state = state_at(scen, t0 + k * 0.05)
                write_state(tmp_path / "state", state)
                mirror_sysfs(tmp_path / "root", state)

        mover = threading.Thread(target=advance)
        mover.start()
        try:
            results = run_checks(host)
        finally:
            stop.set()
            mover.join()
        (r,) = [r for r in results if (r.group, r.check) == ("gpu 0", "PCIe errors")]
        assert r.status == want, r
        if want == "warn":
            assert "PCIe replays in 2 s" in r.detail and "correctable PCIe (AER) errors rising" in r.detail, r
        else:
            assert "480 replays since the driver loaded" in r.detail and "AER: 420 correctable" in r.detail, r
        others = {(x.group, x.check, x.status) for x in results if x.status != "pass" and x.group != "daemon"}
        assert others == ({("gpu 0", "PCIe errors", "warn")} if want == "warn" else set())
