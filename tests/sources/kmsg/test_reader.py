"""The kernel-log reader: a followed file (sim replay), a FIFO (event-driven, as /dev/kmsg), EPIPE and ring wrap,
restart without re-counting, permission denied, and the real /dev/kmsg when this host lets us read it."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from gpuwatchd.exporter.kernel_log_families import kernel_log_families
from gpuwatchd.model import GpuSample, Snapshot
from gpuwatchd.runtime.clock import ManualClock
from gpuwatchd.sources.kmsg import reader as kmsg_reader
from gpuwatchd.sources.kmsg.ingest import KernelLogIngest
from gpuwatchd.sources.kmsg.parse import format_record
from gpuwatchd.sources.kmsg.reader import MAX_RECORD_BYTES, READ_SIZE, KmsgReader, RecordSplitter, load_state
from gpuwatchd.store import Store

UUID = "GPU-3a1e07c5-9c0f-4b7e-8d1a-e6b3090e6b30"
T0 = 1_700_000_000.0
DEADLINE = 60.0  # wall seconds: generous, for a loaded 2-core machine; every wait polls a condition


def xid(seq: int, code: int = 13) -> bytes:
    line = f"NVRM: Xid (PCI:0000:06:00): {code}, pid=7, name=python3, Ch 0000000{seq % 10}"
    return format_record(seq, seq * 1000, line)


async def until(cond: Callable[[], bool]) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.02)


def make(tmp_path: Path, path: Path) -> tuple[Store, KernelLogIngest, KmsgReader]:
    store = Store()
    store.apply(Snapshot(timestamp=T0, nvml_ok=True,
                         gpus=(GpuSample(uuid=UUID, index=0, pci_bus_id="00000000:06:00.0"),)))
    ingest = KernelLogIngest(store)
    reader = KmsgReader(path, ingest, clock=ManualClock(T0 + 10), state_file=tmp_path / "kernel-log.json")
    return store, ingest, reader


async def running(reader: KmsgReader, body: Callable[[], Awaitable[None]]) -> None:
    task = asyncio.create_task(reader.run())
    try:
        await body()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await reader.stop()


def test_splitter_keeps_dictionary_lines_and_partial_lines() -> None:
    sp = RecordSplitter()
    # a record is complete once the next one's header line is (or at flush): dictionary lines may follow
    assert sp.feed(b"6,1,5,-;first\n SUBSYSTEM=pci\n DEVICE=+pci:0000:06:00.0\n6,2,6,-;sec") == []
    assert sp.feed(b"ond\n") == [b"6,1,5,-;first\n SUBSYSTEM=pci\n DEVICE=+pci:0000:06:00.0"]
    assert sp.flush() == [b"6,2,6,-;second"]
    assert sp.feed(b" ORPHAN=1\n") == [] and sp.flush() == []


def test_followed_file_then_restart_reads_only_what_is_new(tmp_path: Path) -> None:
    ring = tmp_path / "kmsg"
    ring.write_bytes(xid(1) + xid(2))

    async def first() -> None:
        store, ingest, reader = make(tmp_path, ring)

        async def body() -> None:
            await until(lambda: store.xid_counts.get((UUID, 13)) == 2)
            with ring.open("ab") as f:
                f.write(xid(3, 79))
            await until(lambda: store.xid_counts.get((UUID, 79)) == 1)

        await running(reader, body)
        assert ingest.stats.up is False  # stopped
        assert load_state(tmp_path / "kernel-log.json")["seq"] == 3

    asyncio.run(first())

    async def second() -> None:
        ring.write_bytes(ring.read_bytes() + xid(4, 48))  # same file (inode): same "boot"
        store, ingest, reader = make(tmp_path, ring)

        async def body() -> None:
            await until(lambda: ingest.stats.last_seq == 4)

        await running(reader, body)
        # only record 4 is new: nothing counted or alerted twice after the restart
        assert store.xid_counts == {(UUID, 48): 1}
        assert [e.xid for e in store.recent_xids] == [48]
        assert ingest.stats.records_lost == 0

    asyncio.run(second())


def test_ring_wrapped_while_down_counts_the_lost_records(tmp_path: Path) -> None:
    ring = tmp_path / "kmsg"
    ring.write_bytes(xid(1))
    st = os.stat(ring)
    (tmp_path / "kernel-log.json").write_text(json.dumps(
        {"version": 1, "boot_id": f"file:{st.st_dev}:{st.st_ino}", "seq": 3, "addresses": {}}))
    ring.write_bytes(xid(10) + xid(11))  # the ring now starts at 10: 4..9 were overwritten

    async def main() -> None:
        store, ingest, reader = make(tmp_path, ring)
        await running(reader, lambda: until(lambda: ingest.stats.last_seq == 11))
        assert ingest.stats.records_lost == 6
        assert store.xid_counts == {(UUID, 13): 2}
        assert [s.value for m in kernel_log_families(store) for s in m.samples
                if s.name == "gpuwatchd_kernel_log_records_lost_total"] == [6]

    asyncio.run(main())


def test_other_boot_starts_from_the_oldest_record(tmp_path: Path) -> None:
    ring = tmp_path / "kmsg"
    ring.write_bytes(xid(1) + xid(2))
    (tmp_path / "kernel-log.json").write_text(json.dumps(
        {"version": 1, "boot_id": "another-boot", "seq": 5, "addresses": {"00000000:3B:00.0": "GPU-x"}}))

    async def main() -> None:
        store, ingest, reader = make(tmp_path, ring)
        await running(reader, lambda: until(lambda: ingest.stats.last_seq == 2))
        assert store.xid_counts == {(UUID, 13): 2}
        assert ingest.addresses["00000000:3B:00.0"] == "GPU-x"  # the map survives reboots: UUIDs do not change

    asyncio.run(main())


def test_fifo_is_read_from_the_event_loop(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)

    async def main() -> None:
        store, ingest, reader = make(tmp_path, fifo)
        wfd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer that keeps the FIFO open
        try:
            async def body() -> None:
                await until(lambda: ingest.stats.up)
                assert reader._event_driven
                os.write(wfd, xid(1)[:10])  # half a record: nothing yet
                await asyncio.sleep(0.1)
                assert ingest.stats.last_seq is None
                os.write(wfd, xid(1)[10:] + xid(2))
                await until(lambda: store.xid_counts.get((UUID, 13)) == 2)

            await running(reader, body)
        finally:
            os.close(wfd)

    asyncio.run(main())


def test_epipe_means_overwritten_records_and_reading_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ring = tmp_path / "kmsg"
    ring.write_bytes(b"")
    script: list[bytes | OSError] = [xid(1), OSError(errno.EPIPE, "Broken pipe"), xid(5), BlockingIOError()]

    def fake_read(fd: int, n: int) -> bytes:
        item = script.pop(0) if script else BlockingIOError()
        if isinstance(item, OSError):
            raise item
        return item

    async def main() -> None:
        store, ingest, reader = make(tmp_path, ring)
        monkeypatch.setattr(kmsg_reader.os, "read", fake_read)
        await running(reader, lambda: until(lambda: ingest.stats.last_seq == 5))
        assert ingest.stats.records_lost == 3
        assert store.xid_counts == {(UUID, 13): 2}

    asyncio.run(main())


def test_permission_denied_is_one_line_and_a_metric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    real_open = os.open

    def deny(path: str | os.PathLike[str], flags: int, *a: int) -> int:
        if str(path).endswith("kmsg"):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_open(path, flags, *a)

    async def main() -> None:
        store, ingest, reader = make(tmp_path, tmp_path / "kmsg")
        monkeypatch.setattr(kmsg_reader.os, "open", deny)
        monkeypatch.setattr(kmsg_reader, "RETRY_INTERVAL", 0.05)
        with caplog.at_level(logging.WARNING, logger="gpuwatchd.sources.kmsg.reader"):
            await running(reader, lambda: asyncio.sleep(0.5))  # several retries
        assert ingest.stats.up is False
        assert "CAP_SYSLOG" in (ingest.stats.error or "")
        assert store.sources["kernel_log"].success is False
        fams = {m.name: m for m in kernel_log_families(store)}
        assert fams["gpuwatchd_kernel_log_up"].samples[0].value == 0
        assert "permission denied" in fams["gpuwatchd_kernel_log_error"].samples[0].labels["reason"]
        assert len([r for r in caplog.records if "kernel log source down" in r.getMessage()]) == 1

    asyncio.run(main())


def test_real_dev_kmsg_when_readable(tmp_path: Path) -> None:
    path = Path("/dev/kmsg")
    if not os.access(path, os.R_OK):
        pytest.skip("/dev/kmsg not readable here (kernel.dmesg_restrict=1 without CAP_SYSLOG, or no such device)")

    async def main() -> None:
        _store, ingest, reader = make(tmp_path, path)
        await running(reader, lambda: until(lambda: ingest.stats.last_seq is not None))
        assert reader._live and reader._event_driven
        assert sum(ingest.stats.lines.values()) > 0
        assert load_state(tmp_path / "kernel-log.json")["boot_id"] == Path(
            "/proc/sys/kernel/random/boot_id").read_text().strip()

    asyncio.run(main())


def test_first_read_of_a_boot_counts_only_recent_xids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The live ring (a character device: here a FIFO taken for one) read for the first time this boot: an Xid
    # from ten minutes ago (past the horizon) teaches nothing new; one from a second ago is counted. Addresses are
    # learnt from both.
    import time

    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    monkeypatch.setattr(kmsg_reader.stat, "S_ISCHR", lambda mode: True)
    now_us = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
    old_us = max(0, now_us - 600 * 1_000_000)
    records = (format_record(1, old_us, "NVRM: GPU at PCI:0000:3b:00: GPU-01d01d00-0000-4000-8000-000000000001")
               + format_record(2, old_us, "NVRM: Xid (PCI:0000:06:00): 48, pid='<unknown>', name=<unknown>, DBE")
               + format_record(3, now_us - 1_000_000, "NVRM: Xid (PCI:0000:06:00): 13, pid=7, name=python3, x"))

    async def main() -> None:
        store, ingest, reader = make(tmp_path, fifo)
        reader.backlog_horizon = 60.0
        wfd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        try:
            async def body() -> None:
                await until(lambda: ingest.stats.up)
                os.write(wfd, records)
                await until(lambda: ingest.stats.last_seq == 3)

            await running(reader, body)
        finally:
            os.close(wfd)
        if old_us == 0:
            pytest.skip("this host booted less than ten minutes ago: no record can be that old")
        assert store.xid_counts == {(UUID, 13): 1}
        assert ingest.addresses["00000000:3B:00.0"] == "GPU-01d01d00-0000-4000-8000-000000000001"
        assert ingest.stats.lines["xid"] == 2  # both lines were read

    asyncio.run(main())


def test_splitter_cuts_overlong_records_in_linear_time() -> None:
    """A 4 MiB line fed in 16 KiB reads: held to MAX_RECORD_BYTES, counted once, the next record intact."""
    sp = RecordSplitter()
    out: list[bytes] = []
    out += sp.feed(b"4,1,1,-;NVRM: Xid (PCI:0000:06:00): 13, ")
    chunk = b"x" * READ_SIZE
    for _ in range(256):
        out += sp.feed(chunk)
    out += sp.feed(b"\n4,2,2,-;next\n")
    out += sp.flush()
    assert [len(r) for r in out] == [MAX_RECORD_BYTES, len(b"4,2,2,-;next")]
    assert out[0].startswith(b"4,1,1,-;NVRM: Xid") and sp.cut == 1


def test_a_read_that_fails_takes_the_source_down_and_never_ends_it(tmp_path: Path) -> None:
    """A path that is a directory opens, then every read fails (EISDIR): down with the reason, still running."""
    path = tmp_path / "not-a-log"
    path.mkdir()
    store, ingest, reader = make(tmp_path, path)

    async def body() -> None:
        await until(lambda: ingest.stats.error is not None)
        assert not ingest.stats.up
        assert ingest.stats.error == f"cannot read {path}: Is a directory"
        assert store.sources["kernel_log"].success is False

    task_done: list[bool] = []

    async def main() -> None:
        task = asyncio.create_task(reader.run())
        await body()
        await asyncio.sleep(0.1)
        task_done.append(task.done())
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert task_done == [False]
