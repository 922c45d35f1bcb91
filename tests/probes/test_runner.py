"""The runner against misbehaving workers (small Python stand-ins: no torch needed) and one real CPU worker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from gpuwatchd.probes.runner import PARENT_ENV, parse_output, run_worker, worker_env

from .conftest import REPO, worker_argv

ENV = worker_env({**os.environ, "PYTHONPATH": str(REPO)}, "GPU-test-uuid")


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_hung_worker_and_its_children_are_killed_at_the_deadline(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    code = f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pidfile)!r}, "w").write(str(child.pid))
        time.sleep(600)
    """
    t0 = time.monotonic()
    run = await run_worker(_py(code), ENV, deadline=3.0)
    assert run.outcome == "timeout"
    assert "did not finish within its 3 s deadline and was killed" in run.detail
    assert time.monotonic() - t0 < 60  # liveness bound only: the deadline itself is 3 s
    grandchild = int(pidfile.read_text())
    for _ in range(200):
        if _gone(grandchild):
            break
        await asyncio.sleep(0.05)
    assert _gone(grandchild), "the worker's own child survived: the group was not killed"


async def test_cancel_kills_the_worker() -> None:
    cancel = asyncio.Event()
    task = asyncio.ensure_future(run_worker(_py("import time; time.sleep(600)"), ENV, deadline=300, cancel=cancel))
    await asyncio.sleep(0.3)
    cancel.set()
    run = await asyncio.wait_for(task, 60)
    assert run.outcome == "cancelled" and _gone(run.pid)


@pytest.mark.parametrize(
    ("code", "expect"),
    [
        ("import sys; sys.stderr.write('boom\\n'); sys.exit(1)", "crashed: exited with status 1 after "),
        ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "crashed: killed by SIGSEGV (segmentation fault)"),
        ("print('Segmentation fault (core dumped)')", "printed output that is not a probe result"),
        ("import sys; sys.stdout.write('{\"v\": 1, \"probes\": {\"gem')", "printed a truncated result line"),
        ("pass", "without printing a result"),
        ("import sys; sys.stdout.write('x' * (2 << 20))", "printed more than"),
    ],
)
async def test_faulty_output_is_a_crash_with_a_reason(code: str, expect: str) -> None:
    run = await run_worker(_py(code), ENV, deadline=60)
    assert run.outcome == "crash"
    assert expect in run.detail


def test_parse_output_takes_the_last_json_line() -> None:
    data, problem = parse_output(b'noise\n{"v": 1, "probes": {}}\n', 0, "")
    assert data == {"v": 1, "probes": {}} and problem == ""


async def test_worker_is_pinned_by_uuid_in_its_own_group() -> None:
    code = "import json, os; print(json.dumps({'v': 1, 'cvd': os.environ['CUDA_VISIBLE_DEVICES'], " \
           "'pgid': os.getpgid(0), 'pid': os.getpid()}))"
    run = await run_worker(_py(code), ENV, deadline=60)
    assert run.outcome == "ok" and run.result is not None
    assert run.result["cvd"] == "GPU-test-uuid"
    assert run.result["pgid"] == run.result["pid"] != os.getpgid(0)


async def test_real_cpu_worker_result_through_the_runner(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="gpuwatchd.probes.runner"):
        run = await run_worker(worker_argv("--probe", "launch"), ENV, deadline=120)
    assert run.outcome == "ok", run.detail
    assert run.result is not None and run.result["probes"]["launch"]["status"] == "ok"
    # A healthy run writes nothing to stderr: no "Failed to initialize NumPy" (the probes extra installs numpy).
    assert "wrote to stderr" not in caplog.text, caplog.text


def test_the_probes_extra_installs_numpy_with_torch() -> None:
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in extras["probes"]}
    assert {"torch", "numpy"} <= names


def test_no_orphan_when_the_daemon_dies_mid_probe(tmp_path: Path) -> None:
    """A stand-in daemon runs a real worker that hangs, then is SIGKILLed: the kernel kills the worker."""
    pidfile = tmp_path / "worker.pid"
    daemon = f"""
        import asyncio, os, sys
        sys.path.insert(0, {str(REPO)!r})
        from gpuwatchd.probes.runner import run_worker, worker_env
        argv = [sys.executable, "-m", "gpuwatchd.probes.worker", "--device", "cpu", "--inject", '{{"hang": true}}']
        def started(pid):
            open({str(pidfile)!r}, "w").write(str(pid))
        asyncio.run(run_worker(argv, worker_env(os.environ, None), 600, on_start=started))
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(PARENT_ENV, None)
    proc = subprocess.Popen(_py(daemon), env=env)
    try:
        for _ in range(600):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.05)
        worker = int(pidfile.read_text())
        time.sleep(0.5)  # let the worker reach its prctl (it also exits if the parent is already gone)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        for _ in range(600):
            if _gone(worker):
                break
            time.sleep(0.05)
        assert _gone(worker), "the probe worker outlived the daemon"
    finally:
        proc.kill()
        proc.wait()


TORCH_WARNING = ("/usr/lib/python3/site-packages/torch/_subclasses/functional_tensor.py:276: UserWarning: Failed "
                 "to initialize NumPy\n  cpu = _conversion_method_template(device=torch.device(\"cpu\"))")


async def test_a_crash_says_what_happened_not_the_last_stderr_line() -> None:
    """A worker killed by a signal after an unrelated warning: the signal and the time, not the warning's tail."""
    code = f"""
        import os, signal, sys
        sys.stderr.write({TORCH_WARNING!r} + "\\n"); sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    """
    run = await run_worker(_py(code), ENV, deadline=300)
    assert run.outcome == "crash"
    assert run.detail.startswith("crashed: killed by SIGSEGV (segmentation fault) after ")
    assert "_conversion_method_template" not in run.detail and "NumPy" not in run.detail


async def test_a_python_exception_is_named_and_an_exit_status_is_said() -> None:
    code = f"""
        import sys
        sys.stderr.write({TORCH_WARNING!r} + "\\n")
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    """
    run = await run_worker(_py(code), ENV, deadline=300)
    assert run.outcome == "crash"
    assert run.detail.startswith("crashed: exited with status 1 after ")
    assert run.detail.endswith(": RuntimeError: CUDA error: an illegal memory access was encountered")
    quiet = await run_worker(_py("import sys; sys.stderr.write('just a warning\\n'); sys.exit(3)"), ENV, deadline=300)
    assert quiet.detail.startswith("crashed: exited with status 3 after ") and "warning" not in quiet.detail


def test_parse_output_names_signals_and_fatal_errors() -> None:
    _, why = parse_output(b"", -9, "some warning")
    assert why == "crashed: killed by SIGKILL (killed)"
    _, why = parse_output(b"", -6, "Fatal Python error: Aborted\n\nCurrent thread 0x01:\n  File x")
    assert why == "crashed: killed by SIGABRT (aborted): Fatal Python error: Aborted"
    _, why = parse_output(b"", 0, "UserWarning: something", 2.0)
    assert why == "exited (status 0) after 2.0 s without printing a result"
