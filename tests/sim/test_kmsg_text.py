"""Pasted kernel logs in every format people paste, turned into kernel-log entries for the replay."""

from __future__ import annotations

import pytest

from gpuwatchd.sim.kmsg_text import Entry, parse_text, to_records
from gpuwatchd.sources.kmsg import parse as kp

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2211, name=python3, GPU has fallen off the bus."
UUID_LINE = "NVRM: GPU at PCI:0000:3b:00: GPU-11111111-2222-3333-4444-555555555555"

FORMATS = {
    "dmesg": f"[  219.524218] {UUID_LINE}\n[  219.52] {XID}\n[  220.000001] usb 1-1: reset\n",
    "dmesg -T": f"[Sun Feb 23 16:24:18 2025] {UUID_LINE}\n[Sun Feb 23 16:24:18 2025] {XID}\n"
                "[Sun Feb 23 16:24:19 2025] usb 1-1: reset\n",
    "dmesg -x": f"kern  :info  : [  219.524218] {UUID_LINE}\nkern  :warn  : [  219.524300] {XID}\n"
                "user  :notice: [  219.6] systemd[1]: Started foo\nkern  :info  : [  220.0] usb 1-1: reset\n",
    "dmesg -x --time-format iso": f"kern  :info  : 2025-02-23T16:24:18,123456+00:00 {UUID_LINE}\n"
                                  f"kern  :warn  : 2025-02-23T16:24:18,123500+00:00 {XID}\n"
                                  "kern  :info  : 2025-02-23T16:24:19,000000+00:00 usb 1-1: reset\n",
    "dmesg --time-format iso": f"2025-02-23T16:24:18,123456+00:00 {UUID_LINE}\n2025-02-23T16:24:18,1235+00:00 {XID}\n"
                               "2025-02-23T16:24:19,000000+00:00 usb 1-1: reset\n",
    "journalctl -k": f"Jun 10 03:09:55 gpu-host kernel: {UUID_LINE}\nJun 10 03:09:55 gpu-host kernel: {XID}\n"
                     "Jun 10 03:09:56 gpu-host kernel: usb 1-1: reset\n",
    "syslog": f"Jun 10 03:09:55 gpu-host kernel: [  219.524218] {UUID_LINE}\n"
              f"Jun 10 03:09:55 gpu-host kernel: [  219.524300] {XID}\n"
              "Jun 10 03:09:55 gpu-host systemd[1]: NVRM: Xid (PCI:0000:3b:00): 13, not a kernel line\n"
              "Jun 10 03:09:56 gpu-host kernel: [  220.0] usb 1-1: reset\n",
    "journalctl -k -o short-iso": f"2025-06-10T03:09:55+0000 gpu-host kernel: {UUID_LINE}\n"
                                  f"2025-06-10T03:09:55+0000 gpu-host kernel: {XID}\n"
                                  "2025-06-10T03:09:56+0000 gpu-host kernel: usb 1-1: reset\n",
    "/dev/kmsg": f"6,100,219524218,-;{UUID_LINE}\n SUBSYSTEM=pci\n4,101,219524300,-;{XID}\n"
                 "6,102,220000000,-;usb 1-1: reset\n",
    "bare messages": f"{UUID_LINE}\n{XID}\nusb 1-1: reset\n",
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_format_gives_the_same_messages(fmt: str) -> None:
    entries = parse_text(FORMATS[fmt].encode())
    assert [e.message for e in entries] == [UUID_LINE, XID, "usb 1-1: reset"]
    events = [kp.classify(e.message) for e in entries]
    assert events[0] == kp.GpuAddress("00000000:3B:00.0", "GPU-11111111-2222-3333-4444-555555555555")
    assert events[1] == kp.Xid("00000000:3B:00.0", 79, 2211, "python3", "GPU has fallen off the bus.")
    assert events[2] is None


def test_monotonic_stamps_and_levels() -> None:
    entries = parse_text(FORMATS["dmesg -x"].encode())
    assert [(e.usec, e.level) for e in entries] == [(219524218, 6), (219524300, 4), (220000000, 6)]
    assert parse_text(FORMATS["dmesg"].encode())[1].usec == 219520000


def test_indented_continuation_lines_join_the_previous_entry() -> None:
    text = ("[  239.061398] NVRM: A GPU crash dump has been created. If possible, please run\n"
            "               NVRM: nvidia-bug-report.sh as root to collect this data before\n"
            f"[  239.1] {XID}\n")
    entries = parse_text(text.encode())
    assert len(entries) == 2
    assert entries[0].message.split("\n")[1] == "NVRM: nvidia-bug-report.sh as root to collect this data before"


def test_non_utf8_line_is_tolerated_alone() -> None:
    data = b"[  1.0] bad \xff\xfe bytes\n[  2.0] " + XID.encode() + b"\n\n\r\n"
    entries = parse_text(data)
    assert entries[0].message == "bad \ufffd\ufffd bytes"
    assert entries[1].message == XID


def test_records_round_trip_through_the_kmsg_parser() -> None:
    entries = [Entry(5, 4, XID), Entry(None, 6, "line one\nline two")]
    raw = to_records(entries, first_seq=41)
    lines = raw.decode().splitlines()
    assert len(lines) == 2  # a multi-line message is one record (newline escaped as \x0a)
    recs = [kp.parse_record(line) for line in lines]
    got = [(r.seq, r.usec, r.level, r.message) for r in recs if r]
    assert got == [(41, 5, 4, XID), (42, 5, 6, "line one\nline two")]
