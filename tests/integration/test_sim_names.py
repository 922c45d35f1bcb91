"""A file or directory in the current directory named like a built-in scenario (a leftover ``./idle`` state dir)
does not shadow the built-in name (issue 17 item 6): a scenario argument is a path only when it looks like one
(a ``/`` or a .yml/.yaml suffix). ``sim --list`` never dies."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from measured import one_line_error, run_measured
from support import ROOT, free_port

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("kind", ["dir", "file"])
def test_a_local_idle_does_not_shadow_the_builtin(tmp_path: Path, kind: str) -> None:
    local = tmp_path / "idle"
    if kind == "dir":
        (local / "state").mkdir(parents=True)
    else:
        local.write_text("not: [a scenario\n")
    listed = run_measured(("sim", "--list"), env=ENV, cwd=tmp_path, timeout=120)
    assert listed.rc == 0 and "Traceback" not in listed.stderr, listed.describe()
    assert "idle\n" in listed.stdout and "leak\n" in listed.stdout, listed.describe()
    if kind == "file":  # the file is reachable as a path, and then it is that file's error
        m = run_measured(("sim", "--scenario", "./idle", "--listen", f"127.0.0.1:{free_port()}"), env=ENV,
                         cwd=tmp_path, timeout=120)  # fmt: skip
        assert not one_line_error(m), m.describe()
        assert "idle: " in m.stderr, m.describe()
        return
    m = run_measured(("sim", "--scenario", "idle", "--listen", f"127.0.0.1:{free_port()}", "--state-dir",
                      str(tmp_path / "sd")), env=ENV, cwd=tmp_path, timeout=120,
                     until_stdout="scenario 'idle'")  # fmt: skip
    assert m.rc is None and "scenario 'idle'" in m.stdout, m.describe()  # served the built-in until stopped
    assert "Traceback" not in m.stderr, m.describe()


def test_an_unknown_name_with_a_local_file_says_how_to_use_the_file(tmp_path: Path) -> None:
    (tmp_path / "mine").write_text("name: mine\n")
    m = run_measured(("sim", "--scenario", "mine"), env=ENV, cwd=tmp_path, timeout=120)
    assert not one_line_error(m), m.describe()
    assert "unknown scenario 'mine'" in m.stderr and "./mine" in m.stderr, m.describe()


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "deep-json", "huge-clock"])
def test_resume_with_a_hostile_clock_file_starts_afresh(tmp_path: Path, kind: str) -> None:
    """``--resume`` reads sim-clock.json from the user's state dir through the capped, non-blocking reader: a FIFO
    blocked the start, /dev/zero was read without end, deep JSON was a traceback; each is "no saved clock"."""
    state_dir = tmp_path / "sd"
    state_dir.mkdir()
    clock = state_dir / "sim-clock.json"
    if kind == "fifo":
        os.mkfifo(clock)
    elif kind == "dev-zero":
        clock.symlink_to("/dev/zero")
    elif kind == "deep-json":
        clock.write_text("[" * 100_000 + "]" * 100_000)
    else:
        clock.write_text('{"start": 1e300, "now": 1e300, "wall": 1e300}')
    m = run_measured(("sim", "--scenario", "idle", "--state-dir", str(state_dir), "--resume", "--listen",
                      f"127.0.0.1:{free_port()}"), env=ENV, cwd=tmp_path, timeout=120,
                     until_stdout="Ctrl-C to stop")  # fmt: skip
    assert m.rc is None and "Ctrl-C to stop" in m.stdout, m.describe()
    assert "Traceback" not in m.stderr, m.describe()
    assert m.max_rss_mib < 600, m.describe()
