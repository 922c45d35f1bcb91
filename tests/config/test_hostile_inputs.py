"""Hostile and broken input files through the real CLI: one clear line and a non-zero exit, never a traceback or hang.

Every class of issue 11 §2 is generated here at test time (FIFO, devices, billion laughs, huge files, deep nesting,
non-UTF-8, NUL bytes, huge integers, over-long paths, values `run` cannot honour) and fed to `check-config`,
`run --config`, `sim --scenario` and `sim --from-xml` as separate processes, run in parallel.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_forks import ForkPool

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "GPUWATCHD_LOG_LEVEL": "warning"}
# Generous: a busy 2-core machine; a hang shows up as this timeout, not as a slow pass. Each test runs dozens of
# processes (~40 CPU seconds in all on 2 idle cores), so its own limit is far above pytest's default.
TIMEOUT = 300.0
pytestmark = pytest.mark.timeout(1200)
FORK_SERVERS = 2  # the machine's cores
MAX_LINES = 11  # at most ten problems and a count of the rest


def _laughs(levels: int = 12) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _deep_block(levels: int = 300) -> str:
    return "".join(f"{'  ' * i}k{i}:\n" for i in range(levels)) + f"{'  ' * levels}v\n"


# Classes shared by config and scenario files: name -> bytes of the file.
YAML_CLASSES: dict[str, bytes] = {
    "non-utf8": b"name: \xff\xfe\x00bad\n",
    "latin1": "host: caf\xe9\n".encode("latin-1"),
    "nul-byte": b"host: a\x00b\n",
    "deep-flow": b"a: " + b"[" * 200_000,
    "deep-flow-maps": b"a: " + b"{b: " * 5000 + b"1" + b"}" * 5000,
    "deep-block": _deep_block().encode(),
    "huge-int": b"gpus: " + b"9" * 5000 + b"\n",
    "huge-int-small": b"gpus: " + b"9" * 40 + b"\n",
    "huge-hex": b"gpus: 0x" + b"f" * 5000 + b"\n",
    "sexagesimal": b"gpus: " + b":".join([b"59"] * 400) + b"\n",
    "billion-laughs": _laughs().encode(),
    "recursive-alias": b"a: &a [*a, *a]\n",
    "python-tag": b"a: !!python/object/apply:os.system ['true']\n",
    "huge-file": b"# " + b"x" * (10 << 20) + b"\n",
    "many-keys": b"".join(b"k%d: %d\n" % (i, i) for i in range(5_000)),
    "not-a-mapping": b"- 1\n- 2\n",
    "binary": bytes(range(256)) * 64,
}

CONFIG_VALUES: dict[str, str] = {
    "history-step-0": "history: {step: 0}\n",
    "history-retention-0": "history: {retention: 0s}\n",
    "history-step-nan": "history: {step: .nan}\n",
    "history-points": "history: {retention: 366d, step: 1ms}\n",
    "poll-timeout-0": "nvml: {poll_timeout: 0}\n",
    "poll-interval-inf": "nvml: {poll_interval: .inf}\n",
    "duration-1e400": "nvml: {kill_grace: 1e400}\n",
    "duration-huge-text": "nvml: {kill_grace: " + "9" * 60 + "s}\n",
    "backoff-0": "nvml: {restart_backoff_initial: 0}\n",
    "leak-bucket-0": "rules: {leak: {bucket: 0}}\n",
    "leak-window-0": "rules: {leak: {window: 0, min_span: 0}}\n",
    "throttle-window-0": "rules: {throttle: {window: 0}}\n",
    "throttle-share-nan": "rules: {throttle: {min_share: .nan}}\n",
    "noise-inf": "rules: {leak: {noise_factor: .inf}}\n",
    "replays-window-0": "rules: {replays: {window: 0s}}\n",
    "temperature-margin-inf": "rules: {temperature: {margin_celsius: .inf, clear_margin_celsius: .inf}}\n",
    "nul-in-path": 'nvml: {library_path: "/usr/lib\\0/x"}\n',
    "long-path-value": "state_dir: /" + "a" * 5000 + "\n",
    "long-name-value": "sysfs: {root: /" + "b" * 300 + "}\n",
    "host-control": 'host: "a\\nb"\n',
    "listen-long-port": "listen: 127.0.0.1:" + "9" * 5000 + "\n",
    "receiver-port": "notify: {receivers: [{name: a, type: webhook, url: 'http://127.0.0.1:99999/x'}]}\n",
    "receiver-port-text": "notify: {receivers: [{name: a, type: webhook, url: 'http://127.0.0.1:x/'}]}\n",
    "receiver-crlf-header": 'notify: {receivers: [{name: a, type: webhook, url: "http://127.0.0.1/x", '
    'headers: {X-A: "v\\r\\nX-B: w"}}]}\n',
    "receiver-crlf-url": 'notify: {receivers: [{name: a, type: webhook, url: "http://127.0.0.1/x\\r\\nX: y"}]}\n',
    "receiver-rate-tiny": "notify: {receivers: [{name: a, type: webhook, url: 'http://127.0.0.1/x', "
    "rate_limit_per_minute: 1e-300}]}\n",
    "retry-0": "notify: {retry_initial: 0}\n",
}

SCENARIO_VALUES: dict[str, str] = {
    "at-1e308": "name: x\ndescription: x\ntimeline:\n- {at: 1e308, lose: 0}\n",
    "at-nan": "name: x\ndescription: x\ntimeline:\n- {at: .nan, lose: 0}\n",
    "ramp-over-inf": "name: x\ndescription: x\ntimeline:\n- {at: 0, ramp: {path: 'devices[0].temperature', "
    "from: 1, to: 2, over: .inf}}\n",
    "wave-period-huge": "name: x\ndescription: x\ntimeline:\n- {at: 0, wave: {path: 'devices[0].temperature', "
    "mean: 1, amplitude: 2, period: 1e308}}\n",
    "set-huge": "name: x\ndescription: x\ntimeline:\n- {at: 0, set: {'devices[0].temperature': 1e400}}\n",
    "gpus-huge": "name: x\ndescription: x\ngpus: 1000000\n",
    "churn-tiny": "name: x\ndescription: x\nprocesses: {per_gpu: 1, churn_every: 1e-300}\n",
    "churn-count-huge": "name: x\ndescription: x\nprocesses: {per_gpu: 1, churn_count: 1000000000000}\n",
    "slot-huge": "name: x\ndescription: x\ntimeline:\n- {at: 0, lose: 1000000000000000000000}\n",
    # Values of the right type that the stand-in cannot hold (its ranges and lengths, sim/state.py).
    "memory-u64": "name: x\ndescription: x\ndevices: {all: {memory: {total: 18446744073709551615}}}\n",
    "temperature-i64": "name: x\ndescription: x\ntimeline:\n- {at: 0, set: {'devices[0].temperature': "
    "9223372036854775807}}\n",
    "ramp-out-of-range": "name: x\ndescription: x\ntimeline:\n- {at: 5, ramp: {path: 'devices[0].temperature', "
    "from: 40, to: 100000, over: 60}}\n",
    "driver-version-long": "name: x\ndescription: x\nsystem: {driver_version: '" + "5" * 100_000 + "'}\n",
    "process-name-long": "name: x\ndescription: x\ntimeline:\n- {at: 0, add_process: {gpu: 0, pid: 5, name: '"
    + "n" * 100_000 + "'}}\n",
}


def _gpus_xml(n: int) -> str:
    gpu = "<gpu id=\"00000000:{b:02X}:00.0\"><product_name>X</product_name><uuid>GPU-{i:08d}</uuid></gpu>"
    body = "".join(gpu.format(b=i % 256, i=i) for i in range(n))
    return f"<?xml version=\"1.0\" ?><nvidia_smi_log><driver_version>550.54.14</driver_version>{body}</nvidia_smi_log>"


XML_CLASSES: dict[str, bytes] = {
    "non-utf8": b"<nvidia_smi_log>\xff\xfe</nvidia_smi_log>",
    "deep": b"<nvidia_smi_log>" + b"<a>" * 100_000 + b"</a>" * 100_000 + b"</nvidia_smi_log>",
    "deep-in-gpu": b'<nvidia_smi_log><gpu id="0"><product_name>X</product_name><uuid>GPU-1</uuid>'
    + b"<pci>" * 100_000 + b"</pci>" * 100_000 + b"</gpu></nvidia_smi_log>",
    "billion-laughs": (
        b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY l0 "lol">'
        + b"".join(b'<!ENTITY l%d "%s">' % (i, b"&l%d;" % (i - 1) * 10) for i in range(1, 10))
        + b"]><nvidia_smi_log><driver_version>&l9;</driver_version></nvidia_smi_log>"
    ),
    "external-entity": b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
    b"<nvidia_smi_log><driver_version>&e;</driver_version></nvidia_smi_log>",
    "huge-file": b"<nvidia_smi_log><!-- " + b"x" * (10 << 20) + b" --></nvidia_smi_log>",
    "thousand-gpus": _gpus_xml(1000).encode(),
    "huge-number": (
        b'<nvidia_smi_log><gpu id="00000000:01:00.0"><product_name>X</product_name><uuid>GPU-1</uuid>'
        b"<fb_memory_usage><total>"
        + b"9" * 400
        + b" MiB</total></fb_memory_usage></gpu></nvidia_smi_log>"
    ),
    "inf-number": b'<nvidia_smi_log><gpu id="00000000:01:00.0"><product_name>X</product_name><uuid>GPU-1</uuid>'
    b"<fb_memory_usage><total>1e400 MiB</total></fb_memory_usage></gpu></nvidia_smi_log>",
    "long-text": b'<nvidia_smi_log><gpu id="0"><uuid>' + b"U" * 100_000 + b"</uuid></gpu></nvidia_smi_log>",
    "not-xml": b"hello\n",
    "wrong-root": b"<html></html>",
}


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    fork: bool = False  # a child forked from a server that imported the CLI once (cli_forks.py), not a fresh start


def _special(tmp: Path, name: str) -> str:
    """Files that are not regular files, or paths the OS refuses."""
    if name == "fifo":
        fifo = tmp / "fifo.yml"
        if not fifo.exists():
            os.mkfifo(fifo)
        return str(fifo)
    if name == "dir":
        return str(tmp)
    if name == "long-name":
        return str(tmp / ("x" * 300 + ".yml"))
    if name == "long-path":
        return "/" + "/".join(["d" * 200] * 30) + ".yml"
    return name  # /dev/zero, /dev/urandom, /dev/null


SPECIAL = ("fifo", "/dev/zero", "/dev/urandom", "/dev/null", "dir", "long-name", "long-path")


def _write(tmp: Path, name: str, data: bytes, suffix: str) -> str:
    path = tmp / f"{name}{suffix}"
    path.write_bytes(data)
    return str(path)


def _run(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwatchd", *args], capture_output=True, text=True, errors="replace",
        timeout=TIMEOUT, check=False, cwd=ROOT, env=ENV, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _run_forked(cases: list[Case]) -> list[subprocess.CompletedProcess[str]]:
    pool = ForkPool(ENV, ROOT, TIMEOUT, servers=FORK_SERVERS)
    try:
        done = pool.run_all([c.args for c in cases])
    finally:
        pool.close()
    # a child killed at the deadline (rc None) reads as subprocess.run's would: -9
    return [subprocess.CompletedProcess(m.args, -9 if m.rc is None else m.rc, m.stdout, m.stderr) for m in done]


def _check_all(cases: list[Case]) -> None:
    forked = [c for c in cases if c.fork]
    with ThreadPoolExecutor(max_workers=4) as pool:
        fresh = iter(list(pool.map(lambda c: _run(c.args), [c for c in cases if not c.fork])))
    forks = iter(_run_forked(forked)) if forked else iter(())
    results = [next(forks) if c.fork else next(fresh) for c in cases]
    problems = []
    for case, res in zip(cases, results, strict=True):
        out = res.stdout + res.stderr
        lines = res.stderr.strip().splitlines()
        why = []
        if res.returncode == 0:
            why.append("exit 0")
        if "Traceback" in out or "exception was never retrieved" in out:
            why.append("traceback")
        if not lines or len(lines) > MAX_LINES:
            why.append(f"{len(lines)} stderr lines")
        if any(": " not in line for line in lines):
            why.append("a line without 'where: message'")
        if why:
            problems.append(f"{case.id}: {', '.join(why)}; exit {res.returncode}; stderr: {res.stderr[-600:]!r}")
    assert not problems, "\n".join(problems)


def _file_cases(tmp: Path, suffix: str, classes: dict[str, bytes]) -> dict[str, str]:
    files = {name: _write(tmp, name, data, suffix) for name, data in classes.items()}
    files.update({name: _special(tmp, name) for name in SPECIAL})
    return files


def test_config_files(tmp_path: Path) -> None:
    files = _file_cases(tmp_path, ".yml", YAML_CLASSES)
    files.update({name: _write(tmp_path, name, text.encode(), ".yml") for name, text in CONFIG_VALUES.items()})
    # check-config of a regular file forks from one import of the CLI (tests/cli_forks.py: still a process of its own);
    # the special files (FIFO, devices: the hang protection) and `run` start fresh interpreters.
    cases = [Case(f"check-config {name}", ("check-config", path), fork=name not in SPECIAL)
             for name, path in files.items()]  # fmt: skip
    # `run` loads through the same function as check-config: every file-level class, and a sample of the values
    # (all of them would double this module's time for no new path).
    for_run = [*YAML_CLASSES, *SPECIAL, "history-step-0", "poll-timeout-0", "leak-bucket-0", "nul-in-path",
               "receiver-crlf-header", "duration-1e400"]  # fmt: skip
    cases += [Case(f"run --config {name}", ("run", "--config", files[name], "--listen", "127.0.0.1:0"))
              for name in for_run]  # fmt: skip
    # `sim --config` too, through the same loader: one of each kind.
    cases += [Case(f"sim --config {name}", ("sim", "--config", files[name], "--listen", "127.0.0.1:0"))
              for name in ("fifo", "billion-laughs", "history-step-0")]  # fmt: skip
    _check_all(cases)


def test_scenario_files(tmp_path: Path) -> None:
    files = _file_cases(tmp_path, ".yml", YAML_CLASSES)
    files.update({name: _write(tmp_path, name, text.encode(), ".yml") for name, text in SCENARIO_VALUES.items()})
    listen = ("--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"))
    _check_all([Case(f"sim --scenario {name}", ("sim", "--scenario", path, *listen)) for name, path in files.items()])


def test_xml_captures(tmp_path: Path) -> None:
    files = _file_cases(tmp_path, ".xml", XML_CLASSES)
    listen = ("--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"))
    _check_all([Case(f"sim --from-xml {name}", ("sim", "--from-xml", path, *listen)) for name, path in files.items()])


@pytest.mark.parametrize("flag", ["--speed", "--gpus"])
def test_sim_numbers_out_of_range(flag: str) -> None:
    values = ["1e308", "nan", "inf", "-inf", "-1", "0", "1e-300"] if flag == "--speed" else ["1000000", "-1"]
    _check_all([Case(f"sim {flag} {v}", ("sim", "--scenario", "idle", f"{flag}={v}", "--listen", "127.0.0.1:0"))
                for v in values])  # fmt: skip


def test_the_whole_corpus_is_exercised() -> None:
    """Each hostile class is here; removing one must be deliberate (issue 11 §2's list)."""
    want = {"non-utf8", "deep-flow", "deep-block", "huge-int", "billion-laughs", "huge-file", "nul-byte"}
    assert want <= set(YAML_CLASSES)
    assert {"fifo", "/dev/zero", "/dev/urandom", "long-name", "long-path"} <= set(SPECIAL)
    assert {"history-step-0", "poll-timeout-0", "nul-in-path", "receiver-crlf-header", "receiver-port"} <= set(
        CONFIG_VALUES
    )
    assert {"thousand-gpus", "billion-laughs", "deep", "huge-file"} <= set(XML_CLASSES)

