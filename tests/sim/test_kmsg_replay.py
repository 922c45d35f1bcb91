"""The sim's kernel ring file and hostile --kernel-log inputs (FIFO, device, size cap, no kernel lines)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwatchd.sim import kmsg_replay
from gpuwatchd.sim.kmsg_replay import KernelLogError, ReplayRing, load_kernel_log
from gpuwatchd.sources.kmsg.parse import parse_record
from gpuwatchd.sources.kmsg.reader import RecordSplitter


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    with pytest.raises(KernelLogError, match=r"^--kernel-log .*log\.fifo: cannot read: not a regular file \(a FIFO\)$"):
        load_kernel_log(fifo)


def test_size_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kmsg_replay, "MAX_KERNEL_LOG_BYTES", 100)
    big = tmp_path / "big.log"
    big.write_text("[ 1.0] usb 1-1: reset\n" * 10)
    with pytest.raises(KernelLogError, match="file too large"):
        load_kernel_log(big)


def test_a_file_without_kernel_lines_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("\n\nJun 10 03:09:55 host sshd[12]: Accepted publickey for root\n")
    with pytest.raises(KernelLogError, match="no kernel log lines in the file"):
        load_kernel_log(empty)


def test_ring_appends_consecutive_whole_records(tmp_path: Path) -> None:
    ring = ReplayRing(tmp_path / "kmsg")
    ring.append(load_kernel_log(_write(tmp_path, "[ 1.5] NVRM: Xid (PCI:0000:06:00): 13, x\n[ 2.0] b\n")))
    ring.append_lines(["NVRM: GPU at PCI:0000:06:00: GPU-1", "thunderbolt 0-1: device disconnected"])
    sp = RecordSplitter()
    recs = [parse_record(r) for r in sp.feed(ring.path.read_bytes()) + sp.flush()]
    assert [(r.seq, r.message) for r in recs if r] == [
        (1, "NVRM: Xid (PCI:0000:06:00): 13, x"), (2, "b"), (3, "NVRM: GPU at PCI:0000:06:00: GPU-1"),
        (4, "thunderbolt 0-1: device disconnected")]


def test_entry_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A paste of more entries than the cap is refused (32 MiB of one-character lines would be 16M entries)."""
    monkeypatch.setattr(kmsg_replay, "MAX_KERNEL_LOG_ENTRIES", 5)
    with pytest.raises(KernelLogError, match="more than 5 kernel log entries"):
        load_kernel_log(_write(tmp_path, "a\n" * 6))
    assert len(load_kernel_log(_write(tmp_path, "a\n" * 5))) == 5


async def test_feed_appends_from_threads_in_batches_with_consecutive_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay's batches (in a thread) and a player's steps (in another) share one ring: one sequence, no record
    cut or repeated."""
    import asyncio
    import threading

    monkeypatch.setattr(kmsg_replay, "REPLAY_BATCH", 7)
    ring = ReplayRing(tmp_path / "kmsg")
    entries = load_kernel_log(_write(tmp_path, "".join(f"[ {i}.0] line {i}\n" for i in range(500))))
    steps = threading.Thread(target=lambda: [ring.append_lines([f"step {i}"]) for i in range(200)])
    steps.start()
    await kmsg_replay.feed_when_ready(ring, entries, lambda: True)
    await asyncio.to_thread(steps.join)
    sp = RecordSplitter()
    recs = [r for r in (parse_record(x) for x in sp.feed(ring.path.read_bytes()) + sp.flush()) if r is not None]
    assert [r.seq for r in recs] == list(range(1, 701))
    lines = [r.message for r in recs if r.message.startswith("line")]
    assert lines == [f"line {i}" for i in range(500)]


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "in.log"
    p.write_text(text)
    return p


LOOP = """\
name: kmsg-loop
description: kernel lines every cycle
gpus: 1
loop: true
duration: 10
timeline:
  - at: 2
    kmsg: ["NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=a, x"]
  - at: 5
    kmsg: "thunderbolt 0-1: device disconnected"
"""


def test_kmsg_steps_are_due_once_per_cycle() -> None:
    import yaml

    from gpuwatchd.sim.kmsg_replay import due_lines
    from gpuwatchd.sim.scenario import scenario_from_dict

    scen = scenario_from_dict(yaml.safe_load(LOOP))
    assert due_lines(scen, -1, 4) == ["NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=a, x"]
    assert due_lines(scen, 4, 12.5) == ["thunderbolt 0-1: device disconnected",
                                        "NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=a, x"]
    assert due_lines(scen, 12.5, 12.5) == []


@pytest.mark.parametrize(("body", "message"), [
    ("[]", "expected a list of 1 to 100"),
    ("[3]", r"kmsg\[0\]: expected one non-empty line"),
    ('["ok", "  "]', r"kmsg\[1\]: expected one non-empty line"),
    ("{a: 1}", "expected a list of 1 to 100"),
])
def test_bad_kmsg_steps_name_the_step(body: str, message: str) -> None:
    import yaml

    from gpuwatchd.sim.scenario import ScenarioError, scenario_from_dict

    doc = yaml.safe_load(LOOP.replace('kmsg: "thunderbolt 0-1: device disconnected"', f"kmsg: {body}"))
    with pytest.raises(ScenarioError, match=message):
        scenario_from_dict(doc)


def test_player_appends_due_lines_to_the_ring(tmp_path: Path) -> None:
    import yaml

    from gpuwatchd.runtime.clock import ManualClock
    from gpuwatchd.sim.player import Player
    from gpuwatchd.sim.scenario import scenario_from_dict

    clock = ManualClock()
    ring = ReplayRing(tmp_path / "kmsg")
    player = Player(scenario_from_dict(yaml.safe_load(LOOP)), tmp_path / "state", clock, kmsg=ring)
    player.step()
    assert ring.path.read_bytes() == b""
    clock.advance(3)
    player.step()
    player.step()  # nothing new: not appended twice
    sp = RecordSplitter()
    recs = [parse_record(r) for r in sp.feed(ring.path.read_bytes()) + sp.flush()]
    assert [(r.seq, r.message) for r in recs if r] == [(1, "NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=a, x")]
