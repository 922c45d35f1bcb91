"""``gpuwatchd sim --from-csv FILE``: replay a per-second log written by ``nvidia-smi --query-gpu=... --format=csv
-l 1`` (or ``--query-compute-apps=...``) as a scenario of ``series`` steps (``gpuwatchd/sim/series_step.py``).

What real nvidia-smi CSV logs look like: a header line, repeated when the log was
appended to by several runs; units in the header (``memory.used [MiB]``, or ``memory.used[MiB]`` from scripts)
or in the values (``1129 MiB``, ``30 %``, ``33.09 W``, with ``nounits`` neither); ``[N/A]`` and
``[Not Supported]`` where a board has no reading; several GPUs interleaved, told apart by ``uuid``,
``pci.bus_id`` or ``index`` (in that order of preference; a log with none of them is one GPU); a ``timestamp``
column ``2025/05/20 22:24:27.466``. Rows are resampled to one value per second from the first timestamp (the
last reading at or before each second; a missing reading holds the previous one), so the daemon polling at 1 s
reads the file's series. A compute-apps log (``pid``, ``used_memory``) becomes processes that appear, follow their
memory and leave.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuwatchd.config.files import read_text_file
from gpuwatchd.sim.scenario import MAX_POPULATION, Scenario, scenario_from_dict
from gpuwatchd.sim.series_step import MAX_VALUES
from gpuwatchd.sim.standin_abi import MAX_SIM_GPUS

MAX_CSV_BYTES = 256 * 1024 * 1024
# The span a replay covers, from its first reading to its last: one limit, the scenario's series length (one value a
# second), checked while the file is read so the line that crosses it is named (it was a fortnight here and 11.5
# days in the series step: 12-14 day logs passed here and failed there).
MAX_SECONDS = MAX_VALUES
# Readings (numbers) in one log; each costs ~150 bytes through parsing and validation: ~1 GiB at the limit.
MAX_READINGS = 6_000_000
# Per-second values the replay holds in all its series. A gap in the log (a host asleep, two runs days apart) is held
# without a value per second: a gap longer than MAX_FILL_SECONDS starts a new series step after it, so memory follows
# the readings, not the span (64 GPUs logged 11 days apart grew the sim to 3 GiB).
MAX_REPLAY_VALUES = 6_000_000
# What pynvml calls to list a GPU's processes (nvmlDeviceGet{Compute,Graphics}RunningProcesses -> the _v3 symbols).
PROCESS_LISTERS = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3")
MAX_FILL_SECONDS = 60
# Timeline steps the replay may have (a run of readings of one field is one step; a process adds two more): each
# costs a few KiB validated, and the player walks them every tick.
MAX_REPLAY_STEPS = 20_000
# Processes a compute-apps log may name (GPU and pid pairs): as a generated population's limit (sim/scenario.py).
MAX_REPLAY_PROCESSES = MAX_POPULATION
MIB = 1024 * 1024
# Largest memory a reading may name (1 PiB, in MiB): a real GPU has at most a few hundred GiB.
MAX_MEMORY_MIB = float(1 << 30)
# What the stand-in can serve (sim/state.py): utilization 0-100 %, temperature 0-255 C, power in mW in a u32.
RANGES = {
    "memory.used": (MAX_MEMORY_MIB, "MiB"),
    "memory.total": (MAX_MEMORY_MIB, "MiB"),
    "proc.memory": (MAX_MEMORY_MIB, "MiB"),
    "util.gpu": (100.0, "%"),
    "util.memory": (100.0, "%"),
    "temperature": (255.0, "C"),
    "power": ((2**32 - 1) / 1000, "W"),
}
MAX_NAME_BYTES = 95  # nvml.h NVML_DEVICE_NAME_V2_BUFFER_SIZE 96, with the NUL
MAX_PROCESS_NAME_CHARS = 64
MAX_FIELD_CHARS = 40  # a number, a timestamp: longer is not one (shown cut in errors)

# Column name (unit and spaces stripped, lower case) -> what it is. nvidia-smi's --query-gpu names, their
# --query-compute-apps names, and the spellings seen in script-written headers (csv02).
COLUMNS = {
    "timestamp": "timestamp",
    "index": "index", "gpu_index": "index",
    "uuid": "uuid", "gpu_uuid": "uuid",
    "pci.bus_id": "bus", "gpu_bus_id": "bus",
    "name": "name", "gpu_name": "name",
    "memory.used": "memory.used", "memory.total": "memory.total",
    "utilization.gpu": "util.gpu", "gpu_utilization": "util.gpu",
    "utilization.memory": "util.memory", "memory_utilization": "util.memory",
    "temperature.gpu": "temperature", "temperature": "temperature",
    "power.draw": "power",
    "pid": "pid", "process_name": "process", "used_memory": "proc.memory", "used_gpu_memory": "proc.memory",
}
NUMERIC = {"memory.used", "memory.total", "util.gpu", "util.memory", "temperature", "power", "proc.memory"}
# Stand-in field each reading drives, and the factor from the column's unit (MiB, %, W) to the field's.
TARGETS = {
    "memory.used": ("memory.used", MIB),
    "util.gpu": ("utilization.gpu", 1),
    "util.memory": ("utilization.memory", 1),
    "temperature": ("temperature", 1),
    "power": ("power_usage_mw", 1000),
}
_UNIT = re.compile(r"\s*\[[^\]]*\]\s*$")
# ASCII digits only: Python's \d and float() take any script's digits (Arabic-Indic, fullwidth).
_VALUE = re.compile(r"^\s*([-+]?[0-9]+(?:\.[0-9]+)?)\s*(MiB|GiB|KiB|%|W|C|°C)?\s*$", re.ASCII)
_UNIT_BYTES = {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}
_NOT_AVAILABLE = {"[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", ""}


class CsvReplayError(ValueError):
    """A log that cannot be replayed; ``str`` says where (line number) and why."""


@dataclass
class _Gpu:
    name: str | None = None
    uuid: str | None = None
    total_mib: float | None = None
    total_line: int = 0
    max_used_mib: float = 0.0
    max_used_line: int = 0
    rows: list[tuple[float, dict[str, float]]] = field(default_factory=list)


@dataclass
class CsvLog:
    gpus: dict[str, _Gpu]
    procs: dict[tuple[str, int], list[tuple[float, float | None]]]
    names: dict[tuple[str, int], str]
    start: float
    end: float


def _column(text: str) -> str | None:
    return COLUMNS.get(_UNIT.sub("", text).strip().lower().replace(" ", ""))


def _timestamp(text: str, line: int) -> float:
    text = text.strip()
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S.%f"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    raise CsvReplayError(f"line {line}: timestamp {text[:40]!r} is not like 2025/05/20 22:24:27.466")


def _number(text: str, column: str, line: int, label: dict[str, str] | None = None) -> float | None:
    if text.strip().lower() in _NOT_AVAILABLE:
        return None
    what = (label or {}).get(column, column)
    shown = text.strip()[:MAX_FIELD_CHARS]
    m = _VALUE.match(text) if len(text) <= MAX_FIELD_CHARS else None
    if not m:
        raise CsvReplayError(f"line {line}: {what} {shown!r}{'...' if len(text) > MAX_FIELD_CHARS else ''} is not a "
                             f"number of at most {MAX_FIELD_CHARS} characters")
    v = float(m.group(1))
    if m.group(2) in _UNIT_BYTES:
        v *= _UNIT_BYTES[m.group(2)]  # memory columns are in MiB
    hi, unit = RANGES.get(column, (math.inf, ""))
    if not math.isfinite(v) or not 0 <= v <= hi:
        raise CsvReplayError(f"line {line}: {what} {shown!r} is outside 0..{hi:.10g} {unit}".rstrip())
    return v


def _text(value: str, what: str, line: int) -> str:
    if any(ord(c) < 0x20 or c == "\x7f" for c in value):
        raise CsvReplayError(f"line {line}: {what} {value[:MAX_FIELD_CHARS]!r} has control characters")
    return value


def _pid(text: str, line: int) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 5 and 0 < int(text) < 32768):
        raise CsvReplayError(f"line {line}: pid {text[:20]!r} is not a pid below 32768")
    return int(text)


def parse_csv(text: str) -> CsvLog:
    """Parse a query-gpu or query-compute-apps log (several GPUs, repeated headers). Every limit is checked here, on
    the line that crosses it: what passes replays to its end."""
    cols: list[str | None] | None = None
    label: dict[str, str] = {}
    gpus: dict[str, _Gpu] = {}
    procs: dict[tuple[str, int], list[tuple[float, float | None]]] = defaultdict(list)
    names: dict[tuple[str, int], str] = {}
    proc_gpus: set[str] = set()
    start = end = math.nan
    first_line = 0
    readings = 0
    # "\n" only: str.splitlines() also breaks at \x1c-\x1e, \x85 and U+2028 inside a field, and the line numbers
    # of errors would not be the file's.
    for n, line in enumerate(text.split("\n"), 1):
        raw = line.rstrip("\r")
        if not raw.strip():
            continue
        fields = [f.strip() for f in raw.split(",")]
        mapped = [_column(f) if len(f) <= MAX_FIELD_CHARS else None for f in fields]
        if "timestamp" in mapped or sum(m is not None for m in mapped) >= 2:  # a header (again)
            cols = mapped
            # errors name a column as the header does (power.draw, used_gpu_memory)
            label = {m: _UNIT.sub("", f).strip() for m, f in zip(mapped, fields, strict=True) if m is not None}
            continue
        if cols is None:
            raise CsvReplayError(f"line {n}: data before any header (write the log with --format=csv, not noheader)")
        if "timestamp" not in cols:
            raise CsvReplayError(f"line {n}: the header has no timestamp column (add timestamp to --query-gpu)")
        if len(fields) != len(cols):
            raise CsvReplayError(f"line {n}: {len(fields)} fields where the header has {len(cols)}")
        row = dict(zip(cols, fields, strict=True))
        t = _timestamp(row["timestamp"][:MAX_FIELD_CHARS], n)
        if math.isnan(start):
            start = end = t
            first_line = n
        start, end = min(start, t), max(end, t)
        if math.floor(end - start) + 1 > MAX_SECONDS:
            raise CsvReplayError(
                f"line {n}: timestamp {row['timestamp'][:MAX_FIELD_CHARS]!r} makes the log span more than "
                f"{MAX_SECONDS} s ({MAX_SECONDS / 86400:.1f} days) from line {first_line}: replay a part of it")
        key = row.get("uuid") or row.get("bus") or row.get("index") or "0"
        key = key[:MAX_FIELD_CHARS * 3]
        if "pid" in row:
            pkey = (key, _pid(row["pid"], n))
            if pkey not in procs:
                proc_gpus.add(key)
                if len(proc_gpus) > MAX_SIM_GPUS:
                    raise CsvReplayError(f"line {n}: more than {MAX_SIM_GPUS} GPUs")
                if len(procs) >= MAX_REPLAY_PROCESSES:
                    raise CsvReplayError(f"line {n}: more than {MAX_REPLAY_PROCESSES} processes in the log")
            procs[pkey].append((t, _number(row.get("proc.memory", ""), "proc.memory", n, label)))
            if row.get("process"):
                names[pkey] = _text(row["process"], "process_name", n)[:MAX_PROCESS_NAME_CHARS]
            readings += 1
        else:
            gpu = gpus.setdefault(key, _Gpu())
            if len(gpus) > MAX_SIM_GPUS:
                raise CsvReplayError(f"line {n}: more than {MAX_SIM_GPUS} GPUs")
            if row.get("name"):
                name = _text(row["name"], "name", n)
                if len(name.encode()) > MAX_NAME_BYTES:
                    raise CsvReplayError(f"line {n}: name {name[:MAX_FIELD_CHARS]!r}... is {len(name.encode())} "
                                         f"bytes of UTF-8; NVML names are at most {MAX_NAME_BYTES}")
                gpu.name = name
            gpu.uuid = row.get("uuid") or gpu.uuid
            values = {c: v for c in NUMERIC & row.keys() if (v := _number(row[c], c, n, label)) is not None}
            if "memory.total" in values:
                gpu.total_mib = values.pop("memory.total")
                gpu.total_line = n
            if values.get("memory.used", 0.0) > gpu.max_used_mib:
                gpu.max_used_mib, gpu.max_used_line = values["memory.used"], n
            gpu.rows.append((t, values))
            readings += len(values)
        if readings > MAX_READINGS:
            raise CsvReplayError(f"line {n}: more than {MAX_READINGS} readings in the log: replay a part of it")
    if math.isnan(start):
        raise CsvReplayError("no data rows")
    for gpu in gpus.values():
        if gpu.total_mib is not None and gpu.max_used_mib > gpu.total_mib:
            raise CsvReplayError(f"line {gpu.max_used_line}: memory.used {gpu.max_used_mib:g} MiB is more than "
                                 f"memory.total {gpu.total_mib:g} MiB (line {gpu.total_line})")
    return CsvLog(gpus, dict(procs), names, start, end)


def _segments(rows: list[tuple[float, float | None]], start: float) -> list[tuple[int, list[float]]]:
    """The readings as runs of per-second values: (first second, values), each second's value the last reading at
    or before it. Within a run a missing second holds the previous reading; a gap of more than
    ``MAX_FILL_SECONDS`` ends the run, and the next one starts at its reading (the field holds its last value in
    between, as a held reading would, without a value per second)."""
    out: list[tuple[int, list[float]]] = []
    values: list[float] = []
    first = last_k = 0
    for t, v in sorted(rows, key=lambda r: r[0]):
        if v is None:
            continue
        k = max(0, math.ceil(t - start - 1e-6))  # the first second this reading is the latest at
        if values and k - last_k > MAX_FILL_SECONDS:
            out.append((first, values))
            values = []
        if not values:
            first, values = k, [v]
        elif k == last_k:
            values[-1] = v
        else:
            values.extend([values[-1]] * (k - last_k - 1))
            values.append(v)
        last_k = k
    if values:
        out.append((first, values))
    return out


class _Budget:
    """Counts the per-second values of every series against ``MAX_REPLAY_VALUES``."""

    def __init__(self, gpus: int, seconds: int) -> None:
        self.used = self.steps = 0
        self.gpus, self.seconds = gpus, seconds

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_REPLAY_STEPS:
            raise CsvReplayError(
                f"the replay needs more than {MAX_REPLAY_STEPS} timeline steps (runs of readings separated by gaps of "
                f"more than {MAX_FILL_SECONDS} s, processes): replay fewer GPUs or a shorter part of the log")

    def take(self, n: int) -> None:
        self.step()
        self.used += n
        if self.used > MAX_REPLAY_VALUES:
            raise CsvReplayError(
                f"the replay needs more than {MAX_REPLAY_VALUES} per-second values ({self.gpus} GPU(s) over "
                f"{self.seconds} s): replay fewer GPUs or a shorter part of the log")


def _series_steps(path: str, segments: list[tuple[int, list[float]]], factor: float,
                  budget: _Budget) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for first, values in segments:
        budget.take(len(values))
        steps.append({"at": first, "series": {"path": path, "values": [round(x * factor) for x in values]}})
    return steps


def scenario_from_log(log: CsvLog, source: str) -> Scenario:
    seconds = math.floor(log.end - log.start) + 1
    keys = sorted(log.gpus) or sorted({k for k, _ in log.procs})
    slots = {k: i for i, k in enumerate(keys)}
    budget = _Budget(len(keys), seconds)
    devices: dict[str | int, dict[str, Any]] = {}
    timeline: list[dict[str, Any]] = []
    for key, slot in slots.items():
        gpu = log.gpus.get(key, _Gpu())
        dev: dict[str, Any] = {}
        if gpu.name:
            dev["name"] = gpu.name
        if gpu.total_mib is None:  # csv04 logs no total: the used memory must fit, at least
            gpu.total_mib = max(24564.0, gpu.max_used_mib)
        dev["memory"] = {"total": int(gpu.total_mib * MIB)}
        # A log has no link state; the stand-in's default is an idle GPU's downshifted link, which under the log's
        # load would read as a degraded link. A busy GPU trains its link to the maximum.
        dev["pcie"] = {"gen": 4, "width": 16}
        if not log.procs:
            # A GPU log (--query-gpu) says nothing of processes: the replay cannot claim the GPU had none (an empty
            # list with memory used reads as memory held by a dead process). Its process lists answer NOT_SUPPORTED,
            # as on a board or platform that cannot list them, so the daemon knows it does not know.
            dev["errors"] = {sym: "NOT_SUPPORTED" for sym in PROCESS_LISTERS}
        devices[slot] = dev
        for column, (target, factor) in TARGETS.items():
            segments = _segments([(t, v.get(column)) for t, v in gpu.rows], log.start)
            if segments:
                # before its first reading the field reads the first one (the log's GPU was already in that state)
                path = f"devices[{slot}].{target}"
                budget.step()
                timeline.append({"at": 0, "set": {path: round(segments[0][1][0] * factor)}})
                timeline += _series_steps(path, segments, factor, budget)
    for (key, pid), rows in sorted(log.procs.items()):
        slot = slots[key]
        first, last = min(t for t, _ in rows) - log.start, max(t for t, _ in rows) - log.start
        segments = _segments(rows, log.start)
        at = math.floor(first)
        budget.step()
        budget.step()  # its add_process, its remove_process
        timeline.append({"at": at, "add_process": {
            "gpu": slot, "pid": pid, "name": log.names.get((key, pid), "unknown"),
            "used_memory": round(segments[0][1][0] * MIB) if segments else None}})
        path = f"devices[{slot}].processes.compute[pid={pid}].used_memory"
        timeline += _series_steps(path, segments, MIB, budget)
        if last + 1 < seconds:
            timeline.append({"at": math.floor(last) + 1, "remove_process": {"gpu": slot, "pid": pid}})
    doc = {
        "name": "from-csv",
        "description": f"Replay of {source}: {len(keys)} GPU(s), {seconds} s of per-second readings.",
        "gpus": len(keys),
        "devices": devices,
        "timeline": timeline,
    }
    return scenario_from_dict(doc, source)


def load_csv_scenario(path: Path) -> Scenario:
    """``--from-csv FILE`` as a scenario; CsvReplayError (with the file name) on anything unusable."""
    text = read_text_file(path, max_bytes=MAX_CSV_BYTES)
    try:
        return scenario_from_log(parse_csv(text), path.name)
    except CsvReplayError as e:
        raise CsvReplayError(f"{path.name}: {e}") from None
