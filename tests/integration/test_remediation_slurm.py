"""Remediation against a real Slurm (Debian's slurm-wlm: munged, slurmctld, slurmd on loopback, one node): the
sim plays a GPU that falls off the bus and comes back; gpuwatchd drains the node naming the GPU and the evidence,
and resumes it on recovery, but never touches a drain a person set."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import NODE, SlurmCluster, missing_binaries, start_cluster
from support import DaemonProcess, metrics_when, value
from support import wait_until as _wait_until
from test_hotplug import add_pci_function, sysfs_bus_id

from gpuwatchd.sim.state import make_state
from gpuwatchd.sources.sysfs.pcie import PCI_DEVICES

# A recovery (the GPU back, its health healthy for resume_after, then scontrol) beside CI's other jobs took longer
# than support's 30 s once: every condition here gets 180 s, and returns as soon as it holds.
SLURM_WAIT_SECONDS = 180.0


def wait_until(cond: Callable[[], Any], what: str, timeout: float = SLURM_WAIT_SECONDS) -> Any:
    return _wait_until(cond, what, timeout)


FAST_NVML = {"poll_interval": "100ms", "restart_backoff_initial": "100ms", "restart_backoff_max": "300ms"}

pytestmark = pytest.mark.skipif(bool(missing_binaries()),
                                reason=f"Slurm is not installed here (missing {', '.join(missing_binaries())}; "
                                "apt-get install slurm-wlm munge)")


@pytest.fixture
def slurm() -> Iterator[SlurmCluster]:
    cluster = start_cluster()
    yield cluster
    cluster.stop()


def _config(cluster: SlurmCluster, standin_libdir: Path, sysfs: Path, **slurm: Any) -> dict[str, Any]:
    return {
        "sysfs": {"root": str(sysfs)},
        "nvml": {"library_path": str(standin_libdir), **FAST_NVML},
        "remediation": {"slurm": {"enabled": True, "scontrol": "scontrol", "slurm_conf": str(cluster.conf),
                                  "node_name": NODE, "resume_after": "1s", "min_interval": "0s", **slurm}},
    }


def _fall_off_the_bus(state: dict[str, Any], index: int, write: Callable[[dict[str, Any]], Path]) -> None:
    state["devices"][index]["lost"] = True  # NVML answers GPU_IS_LOST
    write(state)


def _recover(d: DaemonProcess, state: dict[str, Any], index: int, write: Callable[[dict[str, Any]], Path],
             sysfs: Path) -> None:
    """What a reset (or a rescan) does: the lost GPU leaves the bus, then comes back answering."""
    dev = state["devices"][index]
    state["devices"] = [g for i, g in enumerate(state["devices"]) if i != index]
    write(state)
    func = sysfs / PCI_DEVICES / sysfs_bus_id(dev)
    for p in sorted(func.iterdir()):
        p.unlink()
    func.rmdir()
    # Wait until the daemon's PCI scan has seen the function go (NVML stops listing it sooner, so the GPU's state can
    # read "removed" first): a re-add within one scan is no change, and nothing would enumerate NVML again.
    gone = f"removed=['{sysfs_bus_id(dev)}']"
    wait_until(lambda: gone in d.log(), "the daemon's PCI scan to see the lost GPU gone")
    dev["lost"] = False
    state["devices"].insert(index, dev)
    write(state)
    add_pci_function(sysfs, sysfs_bus_id(dev))


def _sim(state: dict[str, Any], sysfs: Path) -> None:
    for dev in state["devices"]:
        add_pci_function(sysfs, sysfs_bus_id(dev))


def _firing(d: DaemonProcess, alertname: str) -> list[dict[str, Any]]:
    code, body = d.get("/api/v1/alerts")
    assert code == 200
    return [a for a in json.loads(body) if a["labels"].get("alertname") == alertname and a["state"] == "firing"]


def _actions(d: DaemonProcess, action: str, result: str) -> float:
    return value(d.metrics(), "gpuwatchd_remediation_actions_total", system="slurm", action=action,
                 result=result) or 0.0


def test_drains_a_node_whose_gpu_fell_off_the_bus_and_resumes_it_on_recovery(
    slurm: SlurmCluster,
    start_daemon: Callable[..., DaemonProcess],
    standin_libdir: Path,
    write_sim_state: Callable[[dict[str, Any]], Path],
    tmp_path: Path,
) -> None:
    state = make_state(2)
    bad = state["devices"][1]
    sysfs = tmp_path / "sysfs"
    _sim(state, sysfs)
    cfg = {**_config(slurm, standin_libdir, sysfs), "state_dir": str(tmp_path / "state")}
    sim_path = write_sim_state(state)
    d = start_daemon(cfg, sim_path)
    metrics_when(d, lambda m: value(m, "gpuwatchd_gpus") == 2, "two GPUs present")
    metrics_when(d, lambda m: value(m, "gpuwatchd_remediation_up", system="slurm") == 1, "scontrol answering")
    assert "DRAIN" not in slurm.node()["State"]

    _fall_off_the_bus(state, 1, write_sim_state)
    node = wait_until(lambda: (n := slurm.node()) and "DRAIN" in n["State"] and n, "the node drained")
    reason = node["Reason"]
    assert reason.startswith(f"gpuwatchd: GPU 1 ({bad['uuid']}) unhealthy, reboot"), reason
    assert "GpuLost" in reason and "[root@" in reason  # the evidence; Slurm says who set it and when
    drained = wait_until(lambda: _firing(d, "GpuwatchdNodeDrained"), "the drain notified")
    assert drained[0]["labels"]["node"] == NODE and bad["uuid"] in drained[0]["annotations"]["summary"]
    assert value(d.metrics(), "gpuwatchd_remediation_node_drained", system="slurm", node=NODE, dry_run="false") == 1
    assert _actions(d, "drain", "ok") == 1

    # A restart while drained: the new daemon holds gpuwatchd's drain (state_dir) and never drains again.
    assert d.stop() == 0
    d = start_daemon(cfg, sim_path)
    metrics_when(d, lambda m: value(m, "gpuwatchd_remediation_node_drained", system="slurm", node=NODE,
                                    dry_run="false") == 1, "the drain held after the restart")
    metrics_when(d, lambda m: value(m, "gpuwatchd_gpu_health_state", uuid=state["devices"][0]["uuid"],
                                    state="healthy") == 1, "the good GPU read")
    assert value(d.metrics(), "gpuwatchd_gpu_health_state", uuid=bad["uuid"], state="healthy") != 1
    assert _actions(d, "drain", "ok") == 0 and slurm.node()["Reason"] == reason  # the same drain, same [who@when]

    _recover(d, state, 1, write_sim_state, sysfs)
    wait_until(lambda: "DRAIN" not in slurm.node()["State"], "the node resumed")
    assert _actions(d, "resume", "ok") == 1 and _actions(d, "drain", "ok") == 0
    wait_until(lambda: not _firing(d, "GpuwatchdNodeDrained"), "the drain notification resolved")
    assert "resumed Slurm node" in d.log()


def test_a_drain_set_by_hand_is_left_alone(
    slurm: SlurmCluster,
    start_daemon: Callable[..., DaemonProcess],
    standin_libdir: Path,
    write_sim_state: Callable[[dict[str, Any]], Path],
    tmp_path: Path,
) -> None:
    slurm.scontrol("update", f"nodename={NODE}", "state=drain", "reason=fan replacement, ticket 4711")
    state = make_state(2)
    bad = state["devices"][0]
    sysfs = tmp_path / "sysfs"
    _sim(state, sysfs)
    d = start_daemon(_config(slurm, standin_libdir, sysfs), write_sim_state(state))
    metrics_when(d, lambda m: value(m, "gpuwatchd_gpus") == 2, "two GPUs present")
    _fall_off_the_bus(state, 0, write_sim_state)
    wait_until(lambda: _actions(d, "drain", "skipped") >= 1, "gpuwatchd to see the node already drained")
    _recover(d, state, 0, write_sim_state, sysfs)
    metrics_when(d, lambda m: value(m, "gpuwatchd_gpu_health_state", uuid=bad["uuid"], state="healthy") == 1,
                 "the GPU healthy again")
    node = slurm.node()
    assert "DRAIN" in node["State"] and node["Reason"].startswith("fan replacement, ticket 4711"), node
    assert _actions(d, "drain", "ok") == 0 and _actions(d, "resume", "ok") == 0
    assert "leaving it to whoever did that" in d.log()


def test_a_drain_changed_by_a_person_is_not_resumed(
    slurm: SlurmCluster,
    start_daemon: Callable[..., DaemonProcess],
    standin_libdir: Path,
    write_sim_state: Callable[[dict[str, Any]], Path],
    tmp_path: Path,
) -> None:
    state = make_state(1)
    sysfs = tmp_path / "sysfs"
    _sim(state, sysfs)
    d = start_daemon(_config(slurm, standin_libdir, sysfs, resume_after="2s"), write_sim_state(state))
    metrics_when(d, lambda m: value(m, "gpuwatchd_gpus") == 1, "one GPU present")
    _fall_off_the_bus(state, 0, write_sim_state)
    wait_until(lambda: "DRAIN" in slurm.node()["State"], "the node drained")
    # An operator takes over: same drain, their own reason.
    slurm.scontrol("update", f"nodename={NODE}", "state=drain", "reason=RMA: GPU sent back")
    _recover(d, state, 0, write_sim_state, sysfs)
    wait_until(lambda: _actions(d, "resume", "skipped") >= 1, "gpuwatchd to give the node back to the person")
    node = slurm.node()
    assert "DRAIN" in node["State"] and node["Reason"].startswith("RMA: GPU sent back"), node
    assert _actions(d, "resume", "ok") == 0
    wait_until(lambda: not _firing(d, "GpuwatchdNodeDrained"), "gpuwatchd no longer claiming the drain")
