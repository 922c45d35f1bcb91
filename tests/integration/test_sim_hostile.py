"""`gpuwatchd sim` with hostile replays and scenarios (issue 21 items 11-12): CSV and XML captures with huge,
308-digit or non-ASCII numbers, Unicode pids, over-long or multibyte names; scenario files with .inf, huge sizes,
a 1e-300 s loop, a maximal process population; kernel logs of millions of continuation lines. Each is one line
naming the line (or element) and the field, exit 2, before anything is served; no traceback, bounded memory. What
is valid but sparse (64 GPUs logged 11 days apart) is served without a value per second of the gap."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_forks import ForkPool, Measured
from measured import one_line_error, run_measured
from support import ROOT, free_port

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "GPUWATCHD_LOG_LEVEL": "warning"}
TIMEOUT = 240.0  # a hang shows up as this, not as a slow pass on a busy host
MAX_RSS_MIB = 600  # a refused file; the dense gap filling grew to 3 GiB and more
MAX_SERVING_RSS_MIB = 1200  # a sim that serves 64 GPUs (daemon, player, state of every GPU)
pytestmark = pytest.mark.timeout(900)

CSV_HEADER = ("timestamp, index, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], temperature.gpu, "
              "power.draw [W]\n")
APPS_HEADER = "timestamp, gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"


def _row(ts: str = "2025/05/20 00:00:00.000", name: str = "NVIDIA A10G", used: str = "1000 MiB",
         total: str = "23028 MiB", util: str = "5 %", temp: str = "40", power: str = "60.5 W") -> str:
    return f"{ts}, 0, {name}, {used}, {total}, {util}, {temp}, {power}\n"


def _app(pid: str, mem: str = "100 MiB") -> str:
    return f"{APPS_HEADER}2025/05/20 00:00:00.000, GPU-1, {pid}, python, {mem}\n"


CSV_CASES = {
    "power-308-digits": CSV_HEADER + _row(power="1" + "0" * 308 + " W"),
    "memory-near-1e308": CSV_HEADER + _row(used=str(int(1.7976931348623157e308)) + " MiB"),
    "power-30-digits": CSV_HEADER + _row(power="1" * 30 + " W"),
    "temperature-300": CSV_HEADER + _row(temp="300"),
    "utilization-150": CSV_HEADER + _row(util="150 %"),
    "used-over-total": CSV_HEADER + _row(used="30000 MiB"),
    "arabic-digits": CSV_HEADER + _row(temp="\u0661\u0663"),
    "fullwidth-digits": CSV_HEADER + _row(temp="\uff11\uff13"),
    "name-96-bytes": CSV_HEADER + _row(name="N" * 96),
    "name-multibyte-100-bytes": CSV_HEADER + _row(name="\u00e9" * 50),
    "name-nul": CSV_HEADER + _row(name="A\x00B"),
    "span-13-days": CSV_HEADER + _row() + _row(ts="2025/06/02 00:00:00.000"),
    "pid-arabic": _app("\u0661\u0663"),
    "pid-superscript": _app("\u00b2"),
    "pid-4301-digits": _app("1" * 4301),
    "process-memory-huge": _app("42", mem="9" * 400 + " MiB"),
    # 300 GPU UUIDs in a compute-apps log; then 20000 processes on one GPU
    "apps-300-gpus": APPS_HEADER + "".join(f"2025/05/20 00:00:00.000, GPU-{i}, {1 + i}, python, 1 MiB\n"
                                           for i in range(300)),
    "apps-20000-processes": APPS_HEADER + "".join(f"2025/05/20 00:00:00.000, GPU-1, {1 + i}, python, 1 MiB\n"
                                                  for i in range(20000)),
    # a GPU read every 61 s: each reading is a run of its own, a series step per field (4 x 5200)
    "gaps-everywhere": CSV_HEADER + "".join(
        _row(ts=f"2025/05/{20 + s // 86400:02d} {s % 86400 // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}.000")
        for s in range(0, 61 * 5200, 61)),
}


def _xml(inner: str = "", name: str = "NVIDIA A10G", procs: str = "") -> str:
    return ('<?xml version="1.0" ?><nvidia_smi_log><driver_version>550.54.14</driver_version><cuda_version>12.4'
            f'</cuda_version><gpu id="00000000:01:00.0"><product_name>{name}</product_name><uuid>GPU-1</uuid>{inner}'
            f"<processes>{procs}</processes></gpu></nvidia_smi_log>")


def _proc(pid: str, mem: str = "100 MiB", name: str = "python") -> str:
    return (f"<process_info><pid>{pid}</pid><type>C</type><process_name>{name}</process_name>"
            f"<used_memory>{mem}</used_memory></process_info>")


def _fb(total: str) -> str:
    return f"<fb_memory_usage><total>{total}</total><used>1 MiB</used><free>1 MiB</free></fb_memory_usage>"


XML_CASES = {
    "memory-308-digits": _xml(_fb("1" * 308 + " MiB")),
    "memory-near-1e308": _xml(_fb(str(int(1.7976931348623157e308)) + " MiB")),
    "power-300-digits": _xml("<gpu_power_readings><power_draw>" + "9" * 300 + " W</power_draw></gpu_power_readings>"),
    "temperature-huge": _xml("<temperature><gpu_temp>99999999999 C</gpu_temp></temperature>"),
    "pid-arabic": _xml(procs=_proc("\u0661\u0663")),
    "pid-superscript": _xml(procs=_proc("\u00b2")),
    "pid-4301-digits": _xml(procs=_proc("1" * 4301)),
    "process-memory-huge": _xml(procs=_proc("42", mem="1" * 300 + " MiB")),
    "name-96-bytes": _xml(name="N" * 96),
    "name-multibyte": _xml(name="\u00e9" * 60),
    "pstate-arabic": _xml("<performance_state>P\u0661</performance_state>"),
    "bus-5000-hex-digits": _xml("<pci><pci_bus>" + "F" * 4000 + "</pci_bus></pci>"),
}

_SCEN = "name: x\ndescription: d\ngpus: 1\n"
SCENARIO_CASES = {
    "temperature-inf": _SCEN + "devices:\n  all: {temperature: .inf}\n",
    "set-inf": _SCEN + "timeline:\n  - at: 1\n    set: {'devices[0].temperature': .inf}\n",
    "delay-inf": _SCEN + "devices:\n  all: {delays_ms: {'*': .inf}}\n",
    "delay-nan": _SCEN + "devices:\n  all: {delays_ms: {'*': .nan}}\n",
    "memory-400-digit-size": _SCEN + "devices:\n  all: {memory: {total: " + "9" * 400 + "GiB}}\n",
    "memory-huge-size": _SCEN + "devices:\n  all: {memory: {total: 9999999999999999999999999999GiB}}\n",
    "ramp-to-inf": _SCEN + "timeline:\n  - at: 0\n    ramp: {path: 'devices[0].temperature', from: 0, to: .inf, "
                           "over: 10}\n",
    "process-memory-huge": _SCEN + "timeline:\n  - at: 0\n    add_process: {gpu: 0, pid: 42, used_memory: "
                                   "99999999999999999999999GiB}\n",
    "series-1e308": _SCEN + "timeline:\n  - at: 0\n    series: {path: 'devices[0].temperature', values: [1e308]}\n",
    "series-999-in-the-middle": _SCEN + "timeline:\n  - at: 0\n    series: {path: 'devices[0].temperature', "
                                        "values: [40, 999, 40, 40]}\n",
    "tiny-loop": _SCEN + "loop: true\nduration: 1.0e-300\ntimeline:\n  - at: 0\n    set: "
                         "{'devices[0].temperature': 50}\n",
    "maximal-population": "name: x\ndescription: d\ngpus: 256\nprocesses: {per_gpu: 4096, churn_every: 0.1, "
                          "churn_count: 4096}\n",
}


def _assert_refused(results: list[Measured]) -> None:
    problems = []
    for m in results:
        why = one_line_error(m)
        if m.max_rss_mib > MAX_RSS_MIB:
            why.append(f"{m.max_rss_mib:.0f} MiB > {MAX_RSS_MIB}")
        if m.rc not in (None, 0, 2):
            why.append(f"exit {m.rc}, not 2 (usage)")
        if why:
            problems.append(f"{', '.join(why)}: {m.describe()}")
    assert not problems, "\n".join(problems)


def _write(tmp: Path, cases: dict[str, str], suffix: str) -> dict[str, Path]:
    out = {}
    for name, text in cases.items():
        out[name] = tmp / f"{name}{suffix}"
        out[name].write_text(text, encoding="utf-8")
    return out


def test_hostile_replays_and_scenarios_are_refused_in_one_line(tmp_path: Path) -> None:
    listen = ("--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"))
    cases = [("sim", "--from-csv", str(p), *listen) for p in _write(tmp_path, CSV_CASES, ".csv").values()]
    cases += [("sim", "--from-xml", str(p), *listen) for p in _write(tmp_path, XML_CASES, ".xml").values()]
    cases += [("sim", "--scenario", str(p), *listen) for p in _write(tmp_path, SCENARIO_CASES, ".yml").values()]
    cases.append(("sim", "--scenario", "fleet", "--gpus", "256", *listen))  # the population limit, via --gpus
    pool = ForkPool(ENV, ROOT, TIMEOUT)
    try:
        results = pool.run_all(cases)
    finally:
        pool.close()
    _assert_refused(results)
    names = [*(f"csv {n}" for n in CSV_CASES), *(f"xml {n}" for n in XML_CASES),
             *(f"scenario {n}" for n in SCENARIO_CASES), "fleet-256"]  # fmt: skip
    err = {name: m.stderr for name, m in zip(names, results, strict=True)}
    # the error names the line and the field (CSV), the element (XML), the field (scenario)
    assert "line 2: power.draw" in err["csv power-308-digits"]
    assert "line 2: pid" in err["csv pid-arabic"]
    assert "line 3: timestamp" in err["csv span-13-days"]
    assert "gpu_power_readings/power_draw" in err["xml power-300-digits"]
    assert "processes/process_info[1]/pid" in err["xml pid-arabic"]
    assert "timeline[0].set.devices[0].temperature" in err["scenario set-inf"]
    assert "at t=1.5s: devices[0].temperature: 999" in err["scenario series-999-in-the-middle"]
    assert "loop" in err["scenario tiny-loop"] and "processes.per_gpu" in err["scenario maximal-population"]
    assert "--gpus 256" in err["fleet-256"]
    assert "line 258: more than 256 GPUs" in err["csv apps-300-gpus"]
    assert "more than 16384 processes" in err["csv apps-20000-processes"]
    assert "timeline steps" in err["csv gaps-everywhere"]


def _serves(args: tuple[str, ...], timeout: float = TIMEOUT) -> Measured:
    m = run_measured(("sim", *args, "--listen", f"127.0.0.1:{free_port()}"), env=ENV, cwd=ROOT, timeout=timeout,
                     until_stdout="Ctrl-C to stop")  # fmt: skip
    assert m.rc is None and "Ctrl-C to stop" in m.stdout, m.describe()  # served, stopped by the test
    assert "Traceback" not in m.stderr, m.describe()
    return m


def test_a_sparse_csv_is_served_without_filling_its_gaps(tmp_path: Path) -> None:
    """A 10 KB log of 64 GPUs read 11 days apart: it grew the sim to 3 GiB in 40 s (every second of the gap was a
    value); now each run of readings is its own series step and the gap holds the last reading."""
    rows = [_row(ts=ts).replace(", 0, ", f", {g}, ", 1)
            for ts in ("2025/05/20 00:00:00.000", "2025/05/31 00:00:00.000") for g in range(64)]  # fmt: skip
    path = tmp_path / "sparse.csv"
    path.write_text(CSV_HEADER + "".join(rows))
    m = _serves(("--from-csv", str(path), "--speed", "100"))
    assert "64 GPU(s)" in m.stdout, m.describe()
    assert m.max_rss_mib < MAX_SERVING_RSS_MIB, m.describe()


def test_a_kernel_log_of_millions_of_continuation_lines_loads_bounded(tmp_path: Path) -> None:
    """4M indented lines after one Xid: appending each to the entry's growing text was quadratic (minutes); the
    entry is now joined once and cut at the kernel's record size."""
    path = tmp_path / "kern.log"
    path.write_text("[    1.000000] NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=python, Graphics Exception\n"
                    + " x\n" * 4_000_000)  # fmt: skip
    m = _serves(("--kernel-log", str(path)))
    assert m.max_rss_mib < MAX_SERVING_RSS_MIB, m.describe()


def test_a_state_the_load_checks_miss_stops_the_sim_in_one_line(tmp_path: Path) -> None:
    """The load-time check builds at most 400 instants; a bad value past them fails in the player, mid-run: the sim
    then stops with one line and exit 6, not a traceback from the player thread under a daemon that goes on."""
    lines = ["name: late", "description: d", "timeline:"]
    for i in range(401):
        lines += [f"  - at: {i}", "    set: {'devices[0].temperature': 40}"]
    lines += ["  - at: 500", "    series: {path: 'devices[0].temperature', values: [999]}"]
    path = tmp_path / "late.yml"
    path.write_text("\n".join(lines) + "\n")
    m = run_measured(("sim", "--scenario", str(path), "--speed", "100", "--listen", f"127.0.0.1:{free_port()}"),
                     env=ENV, cwd=ROOT, timeout=TIMEOUT)  # fmt: skip
    assert m.rc == 6, m.describe()
    assert "Traceback" not in m.stderr, m.describe()
    last = m.stderr.strip().splitlines()[-1]
    assert last.startswith("gpuwatchd sim: scenario 'late' stopped at t=") and "999 is outside 0..255" in last, last


def test_a_series_file_of_millions_of_lines_is_refused_without_holding_them(tmp_path: Path) -> None:
    """A `series` step's file of 16M one-character lines (32 MiB, the file limit): counted while read, refused past
    1,000,000 values without a list of every line (that list took ~370 MB)."""
    values = tmp_path / "values.txt"
    values.write_bytes(b"1\n" * 16_000_000)
    path = tmp_path / "series.yml"
    path.write_text(_SCEN + f"timeline:\n  - at: 0\n    series: {{path: 'devices[0].temperature', file: {values}}}\n")
    pool = ForkPool(ENV, ROOT, TIMEOUT, servers=1)
    try:
        [m] = pool.run_all([("sim", "--scenario", str(path), "--listen", "127.0.0.1:0")])
    finally:
        pool.close()
    assert not one_line_error(m), m.describe()
    assert "more than 1000000" in m.stderr, m.describe()
    assert m.max_rss_mib < 300, m.describe()
