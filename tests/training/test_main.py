"""``python -m gpuwatchd.training train.py ARGS...`` runs the script unchanged with the reporter on, and the client
imports only the standard library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.training.conftest import Listener

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120  # a hang guard on a loaded machine, not a deadline


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def test_runs_the_script_with_its_arguments_and_reports_the_input_wait(tmp_path: Path, listener: Listener) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, time\n"
        "import gpuwatchd.training as t\n"
        "for batch in t.wrap_input(range(3)):\n"
        "    time.sleep(0.01)\n"
        "print(repr(sys.argv), __name__)\n", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "gpuwatchd.training", str(script), "--lr", "0.1"],
                         env=_env(GPUWATCHD_TRAINING_SOCKET=str(listener.path)), capture_output=True, text=True,
                         timeout=TIMEOUT_S, check=True)
    assert out.stdout.strip() == f"{[str(script), '--lr', '0.1']!r} __main__"
    # the last report, at exit: the wait share of the run, from the client's own process
    import time
    end = time.monotonic() + TIMEOUT_S
    while not listener.messages():
        assert time.monotonic() < end, "no report at exit"
        time.sleep(0.02)
    (m,) = listener.messages()
    assert m["v"] == 1 and m["devices"] == [] and 0.0 <= m["input_wait_ratio"] <= 1.0 and m["pid"] != os.getpid()


def test_a_failing_script_keeps_its_exit_status_and_traceback(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit(3)\n", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "gpuwatchd.training", str(script)], env=_env(),
                         capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert out.returncode == 3
    script.write_text("1/0\n", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "gpuwatchd.training", str(script)], env=_env(),
                         capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert out.returncode == 1 and "ZeroDivisionError" in out.stderr


def test_usage_without_a_script() -> None:
    out = subprocess.run([sys.executable, "-m", "gpuwatchd.training"], env=_env(), capture_output=True, text=True,
                         timeout=TIMEOUT_S, check=False)
    assert out.returncode == 2 and "usage: python -m gpuwatchd.training" in out.stderr


def test_the_client_imports_the_standard_library_only() -> None:
    code = ("import sys, gpuwatchd.training as t; t.watch(interval=3600); t.stop(); "
            "import json; print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True,
                         timeout=TIMEOUT_S, check=True)
    mods = json.loads(out.stdout)
    ours = {m for m in mods if m.split(".")[0] == "gpuwatchd"}
    assert ours <= {"gpuwatchd", "gpuwatchd.training", "gpuwatchd.training.input_wait",
                    "gpuwatchd.training.reporter", "gpuwatchd.training.stats", "gpuwatchd.training.wire"}, ours
    stdlib = set(sys.stdlib_module_names)
    foreign = {m.split(".")[0] for m in mods} - stdlib - {"gpuwatchd"} - {"_distutils_hack", "sitecustomize"}
    foreign = {m for m in foreign if not m.startswith("_")}
    assert not foreign, foreign
