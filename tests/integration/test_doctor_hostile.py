"""`gpuwatchd doctor` with hostile arguments and files (issue 21 item 10): every bad option value or user-named file
is one ``gpuwatchd doctor: ...`` line and exit 2, never a traceback, a hang or GiBs of memory. Files are read through
the capped, non-blocking reader of ``config/files.py``, as `run` reads its config."""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_forks import ForkPool, Measured
from measured import one_line_error
from support import ROOT

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "GPUWATCHD_LOG_LEVEL": "warning"}
TIMEOUT = 120.0  # a hang shows up as this, not as a slow pass on a busy host
MAX_RSS_MIB = 400  # doctor's own start is ~60 MiB; the unbounded reads grew to GiBs
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def doctor() -> Iterator[Callable[[list[tuple[str, ...]]], list[Measured]]]:
    """Runs each case as its own `gpuwatchd doctor` process, forked from servers that imported the CLI once for
    the module (measured.py)."""
    pool = ForkPool(ENV, ROOT, TIMEOUT)
    yield lambda cases: pool.run_all([("doctor", *c) for c in cases])
    pool.close()


Doctor = Callable[[list[tuple[str, ...]]], list[Measured]]


def _assert_refused(results: list[Measured]) -> None:
    problems = []
    for m in results:
        why = one_line_error(m)
        if m.max_rss_mib > MAX_RSS_MIB:
            why.append(f"{m.max_rss_mib:.0f} MiB > {MAX_RSS_MIB}")
        if not why and "gpuwatchd doctor: " not in m.stderr:
            why.append("the line does not say it is doctor's")
        if m.rc not in (None, 0) and m.rc != 2:
            why.append(f"exit {m.rc}, not 2 (usage)")
        if why:
            problems.append(f"{', '.join(why)}: {m.describe()}")
    assert not problems, "\n".join(problems)


def _manifest(state_dir: Path, url: str = "http://127.0.0.1:1", state: str | None = None) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    doc = {"root": str(state_dir), "library_dir": str(state_dir), "state": state or str(state_dir / "state"),
           "url": url, "state_dir": str(state_dir)}  # fmt: skip
    import json

    (state_dir / "sim-host.json").write_text(json.dumps(doc))


def test_bad_option_values(doctor: Doctor) -> None:
    cases = [(f"--deadline={v}",) for v in ("nan", "inf", "-inf", "1e308", "-1", "0", "ten", "1e-400")]
    cases += [("--url", u) for u in ("http://[::1", "ftp://127.0.0.1:9945", "http://127.0.0.1:99999", "http://",
                                     "127.0.0.1:9945", "http://127.0.0.1:9945/?x#y", "http://a b", "x" * 5000)]
    _assert_refused(doctor(cases))


def test_hostile_kernel_log_files(doctor: Doctor, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.log"
    with huge.open("wb") as f:  # sparse: 40 MiB of size, no disk
        f.truncate(40 << 20)
    cases = [("--kernel-log", p) for p in ("/dev/zero", "/dev/urandom", str(fifo), str(tmp_path), str(huge),
                                          str(tmp_path / "missing.log"), "/" + "d" * 5000)]  # fmt: skip
    cases += [("--auth-user", "u", "--auth-password-file", p) for p in ("/dev/zero", str(fifo), str(huge))]
    _assert_refused(doctor(cases))


def test_a_ca_file_that_is_not_a_file_is_a_warning(doctor: Doctor, tmp_path: Path) -> None:
    """--ca-file goes to OpenSSL through the same reader: a FIFO blocked it, /dev/zero was read forever."""
    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    results = doctor([("--ca-file", p, "--url", "https://127.0.0.1:1", "--deadline", "10")
                        for p in ("/dev/zero", str(fifo))])  # fmt: skip
    for m in results:
        assert m.rc in (1, 2) and "Traceback" not in m.stdout + m.stderr, m.describe()
        assert "cannot be used as a CA file: cannot read: not a regular file" in m.stdout, m.describe()
        assert m.max_rss_mib < MAX_RSS_MIB, m.describe()


def test_hostile_sim_manifests(doctor: Doctor, tmp_path: Path) -> None:
    """``--sim DIR``: the manifest and the state file it names, whatever they hold."""
    cases: list[tuple[str, ...]] = []
    bodies = {"list": "[]", "null": "null", "number": "5", "string": '"x"', "huge-int": "9" * 5000,
              "deep": "[" * 100_000 + "]" * 100_000, "deep-small": "[" * 20_000 + "]" * 20_000,
              "not-json": "{", "wrong-types": '{"root": 1, "url": []}', "non-utf8": "\udcff"}  # fmt: skip
    for name, body in bodies.items():
        d = tmp_path / name
        d.mkdir()
        (d / "sim-host.json").write_bytes(body.encode("utf-8", "surrogateescape"))
        cases.append(("--sim", str(d)))
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "sim-host.json")
    zero = tmp_path / "zero"
    zero.mkdir()
    (zero / "sim-host.json").symlink_to("/dev/zero")
    cases += [("--sim", str(fifo)), ("--sim", str(zero)), ("--sim", str(tmp_path / "absent"))]
    _manifest(tmp_path / "bad-url", url="http://[::1")
    _manifest(tmp_path / "state-zero", state="/dev/zero")
    _manifest(tmp_path / "state-deep")
    (tmp_path / "state-deep" / "state").write_text("GWSIM 1\n# json " + "[" * 100_000 + "]" * 100_000 + "\nEND\n")
    _manifest(tmp_path / "state-list")
    (tmp_path / "state-list" / "state").write_text("GWSIM 1\n# json []\nEND\n")
    cases += [("--sim", str(tmp_path / n)) for n in ("bad-url", "state-zero", "state-deep", "state-list")]
    _assert_refused(doctor(cases))


def test_hostile_host_root_is_read_bounded(doctor: Doctor, tmp_path: Path) -> None:
    """``--root``: /dev/kmsg that never ends (/dev/zero), a FIFO as the driver's version file. doctor reports and
    ends; reading the ring is capped (it used to grow without end, and to re-split its buffer: 77 s for 32 MiB)."""
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "sys/module/nvidia").mkdir(parents=True)
    (root / "dev/kmsg").symlink_to("/dev/zero")
    os.mkfifo(root / "proc/driver/nvidia/version")
    (root / "sys/module/nvidia/version").symlink_to("/dev/urandom")
    [m] = doctor([("--root", str(root), "--deadline", "10", "--url", "http://127.0.0.1:1")])
    assert m.rc is not None and m.rc in (1, 2), m.describe()  # failures (no driver), not a crash or a hang
    assert "Traceback" not in m.stdout + m.stderr, m.describe()
    assert m.max_rss_mib < MAX_RSS_MIB, m.describe()
    assert "[FAIL] driver" in m.stdout, m.describe()


class _Hostile(http.server.BaseHTTPRequestHandler):
    """Whatever answers at --url: a 100k-deep JSON, a 100 MB body, bytes that are not UTF-8."""

    def do_GET(self) -> None:
        kind = self.server.kind  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        try:
            if kind == "deep":
                self.wfile.write(b"[" * 100_000 + b"]" * 100_000)
            elif kind == "huge":
                chunk = b"[" + b"0," * (1 << 19) + b"0]"
                for _ in range(100):  # ~100 MB, never read whole
                    self.wfile.write(chunk)
            else:
                self.wfile.write(b"\xff\xfe{}")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize("kind", ["deep", "huge", "not-utf8"])
def test_a_hostile_answer_at_url_is_a_warning_not_a_crash(doctor: Doctor, kind: str) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.kind = kind  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        [m] = doctor([("--url", url, "--deadline", "10")])
    finally:
        server.shutdown()
        server.server_close()
    assert m.rc in (1, 2), m.describe()
    assert "Traceback" not in m.stdout + m.stderr, m.describe()
    assert m.max_rss_mib < MAX_RSS_MIB, m.describe()
    assert "[WARN] daemon: running:" in m.stdout, m.stdout
    assert "answered something that is not a gpuwatchd status (" in m.stdout, m.stdout  # and why, in one line


class _Escapes(http.server.BaseHTTPRequestHandler):
    """A daemon whose NVML error text holds terminal escape sequences (the text of a driver error or Xid)."""

    def do_GET(self) -> None:
        body = json.dumps({"daemon": {"version": "1", "host": "h"}, "nvml": {
            "ok": False, "error": "x\x1b[2J\x1b]0;pwned\x07\rback\u202egnp"}, "gpus": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_text_from_the_daemon_reaches_the_terminal_without_escape_sequences(doctor: Doctor) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Escapes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        [m] = doctor([("--url", f"http://127.0.0.1:{server.server_address[1]}", "--deadline", "10")])
    finally:
        server.shutdown()
        server.server_close()
    assert "the daemon's NVML is down: x?[2J?]0;pwned??back?gnp" in m.stdout, m.describe()
    assert not any(c in m.stdout for c in "\x1b\x07\r\u202e"), m.describe()
