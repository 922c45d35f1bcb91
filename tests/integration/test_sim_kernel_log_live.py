"""`gpuwatchd sim --kernel-log` with pastes that held the daemon's event loop in issue 34 (100k lines, 31 MB, binary):
the conversion runs in a thread, so ``/healthz`` answers all along, from the start of the process to the last line
read (the daemon's own reader yields on its own)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, DaemonProcess, free_port, value, wait_until
from test_daemon_live import HealthzWatch, _metrics

XML = Path(__file__).resolve().parents[1] / "sim" / "fixtures" / "two_gpus.xml"


def _xid_flood() -> bytes:
    return b"".join(b"[%8d.000000] NVRM: Xid (PCI:0000:ca:00): 13, pid=%d, name=python3, flood\n" % (i, i)
                    for i in range(100_000))


def _big_lines() -> bytes:
    line = b"[    1.000000] usb 1-1: " + b"x" * 300 + b"\n"
    return line * ((31 << 20) // len(line))


def _binary() -> bytes:
    return os.urandom(31 << 20)


@pytest.mark.parametrize("make", [_xid_flood, _big_lines, _binary], ids=["100k-xids", "31MB", "binary"])
def test_a_large_paste_is_replayed_without_holding_the_loop(tmp_path: Path, make: object) -> None:
    assert callable(make)
    log = tmp_path / "paste.log"
    log.write_bytes(make())
    port = free_port()
    log_path = tmp_path / "sim.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "sim", "--from-xml", str(XML), "--kernel-log", str(log),
             "--listen", f"127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    d = DaemonProcess(proc, f"http://127.0.0.1:{port}", tmp_path / "unused.yml", log_path)
    try:
        with HealthzWatch(d.url, starting=True):

            def serving() -> bool:
                assert proc.poll() is None, d.log()[-3000:]
                with contextlib.suppress(OSError):
                    return d.get("/healthz", timeout=30)[0] == 200
                return False

            wait_until(serving, "the sim serving", timeout=120)

            def read_all() -> bool:
                assert proc.poll() is None, d.log()[-3000:]
                m = _metrics(d)
                lines = sum(v for (name, _), v in m.items() if name == "gpuwatchd_kernel_log_lines_total")
                return lines > 0 and value(m, "gpuwatchd_kernel_log_up") == 1 and (
                    make is not _xid_flood or (value(m, "gpuwatchd_kernel_log_lines_total", kind="xid") or 0)
                    >= 100_000)

            wait_until(read_all, "the paste read by the daemon", timeout=300)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert "Traceback" not in d.log(), d.log()[-3000:]
