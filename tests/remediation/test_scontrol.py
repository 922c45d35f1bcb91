"""scontrol's output read back, and every way calling it can fail (as values, never exceptions)."""

from __future__ import annotations

import os
from pathlib import Path

from gpuwatchd.remediation.scontrol import NodeState, Scontrol, parse_node

SHOW = """NodeName=gwnode Arch=x86_64 CoresPerSocket=1
   CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=1.05
   NodeAddr=127.0.0.1 NodeHostName=localhost Version=22.05.8
   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=debug
   Reason=gpuwatchd: GPU 0 (GPU-abc) unhealthy, reboot: lost; evidence GpuLost [root@2026-11-28T14:46:56]

"""


def test_multi_line_show_node() -> None:
    n = parse_node(SHOW, "gwnode")
    reason = "gpuwatchd: GPU 0 (GPU-abc) unhealthy, reboot: lost; evidence GpuLost"
    assert n == NodeState("gwnode", "IDLE+DRAIN", reason, "root", "2026-11-28T14:46:56")
    assert n.drained
    assert parse_node(SHOW, "gwnode2") is None


def test_one_line_show_node_and_no_reason() -> None:
    text = ("NodeName=a1 Arch=x86_64 State=MIXED ThreadsPerCore=1\n\n"
            "NodeName=a2 Arch=x86_64 State=DOWN+DRAIN Reason=Not responding [slurm@2026-01-01T00:00:00] Comment=x")
    a1 = parse_node(text, "a1")
    assert a1 is not None and a1.state == "MIXED" and a1.reason is None and not a1.drained
    a2 = parse_node(text, "a2")
    assert a2 is not None and a2.reason == "Not responding" and a2.reason_user == "slurm" and a2.drained


def test_drain_flags() -> None:
    for state, drained in (("IDLE", False), ("ALLOCATED", False), ("MIXED+DRAIN", True), ("DRAINED", True),
                           ("DRAINING", True), ("IDLE+DRAIN*", True), ("DOWN*", True), ("IDLE+NOT_RESPONDING", False)):
        assert NodeState("n", state, None, None, None).drained is drained, state


def _script(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "scontrol"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return p


async def test_missing_command(tmp_path: Path) -> None:
    sc = Scontrol(tmp_path / "no-such-scontrol", None, 5.0)
    state, res = await sc.show("n1")
    assert state is None and not res.ok and res.failure == "missing" and "not found" in res.message


async def test_a_node_slurm_does_not_know(tmp_path: Path) -> None:
    sc = Scontrol(_script(tmp_path, 'echo "Node $3 not found"; exit 1\n'), None, 5.0)
    state, res = await sc.show("n1")
    assert state is None and res.failure == "no_node" and "n1 not found" in res.message


async def test_a_hung_controller_times_out(tmp_path: Path) -> None:
    sc = Scontrol(_script(tmp_path, "exec sleep 60\n"), None, 0.5)
    res = await sc.drain("n1", "why")
    assert not res.ok and res.failure == "timeout" and "0.5 s" in res.message


async def test_arguments_and_slurm_conf(tmp_path: Path) -> None:
    out = tmp_path / "args"
    sc = Scontrol(_script(tmp_path, f'printf "%s|" "$SLURM_CONF" "$@" > {out}\n'), tmp_path / "slurm.conf", 5.0,
                  env={"PATH": os.defpath})
    assert (await sc.drain("n1", "gpuwatchd: GPU 0 lost; evidence GpuLost")).ok
    assert out.read_text() == (f"{tmp_path / 'slurm.conf'}|update|nodename=n1|state=drain|"
                               "reason=gpuwatchd: GPU 0 lost; evidence GpuLost|")
    assert (await sc.resume("n1")).ok
    assert out.read_text() == f"{tmp_path / 'slurm.conf'}|update|nodename=n1|state=resume|"
