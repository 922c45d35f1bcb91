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
from gpuwatchd.sim.scenario import Scenario, scenario_from_dict
from gpuwatchd.sim.standin_abi import MAX_SIM_GPUS

MAX_CSV_BYTES = 256 * 1024 * 1024
MAX_SECONDS = 14 * 86400  # a fortnight of 1 s samples
MIB = 1024 * 1024

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
_VALUE = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|%|W|C|°C)?\s*$")
_UNIT_BYTES = {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}
_NOT_AVAILABLE = {"[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", ""}


class CsvReplayError(ValueError):
    """A log that cannot be replayed; ``str`` says where (line number) and why."""


@dataclass
class _Gpu:
    name: str | None = None
    uuid: str | None = None
    total_mib: float | None = None
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


def _number(text: str, what: str, line: int) -> float | None:
    if text.strip().lower() in _NOT_AVAILABLE:
        return None
    m = _VALUE.match(text)
    if not m:
        raise CsvReplayError(f"line {line}: {what} {text.strip()[:40]!r} is not a number")
    v = float(m.group(1))
    if m.group(2) in _UNIT_BYTES:
        v *= _UNIT_BYTES[m.group(2)]  # memory columns are in MiB
    if not math.isfinite(v) or v < 0:
        raise CsvReplayError(f"line {line}: {what} {text.strip()[:40]!r} is out of range")
    return v


def parse_csv(text: str) -> CsvLog:
    """Parse a query-gpu or query-compute-apps log (several GPUs, repeated headers)."""
    cols: list[str | None] | None = None
    gpus: dict[str, _Gpu] = {}
    procs: dict[tuple[str, int], list[tuple[float, float | None]]] = defaultdict(list)
    names: dict[tuple[str, int], str] = {}
    times: list[float] = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        fields = [f.strip() for f in raw.split(",")]
        mapped = [_column(f) for f in fields]
        if "timestamp" in mapped or sum(m is not None for m in mapped) >= 2:  # a header (again)
            cols = mapped
            continue
        if cols is None:
            raise CsvReplayError(f"line {n}: data before any header (write the log with --format=csv, not noheader)")
        if "timestamp" not in cols:
            raise CsvReplayError(f"line {n}: the header has no timestamp column (add timestamp to --query-gpu)")
        if len(fields) != len(cols):
            raise CsvReplayError(f"line {n}: {len(fields)} fields where the header has {len(cols)}")
        row = dict(zip(cols, fields, strict=True))
        t = _timestamp(row["timestamp"], n)
        times.append(t)
        key = row.get("uuid") or row.get("bus") or row.get("index") or "0"
        if "pid" in row:
            pid_text = row["pid"]
            if not pid_text.isdigit() or not 0 < int(pid_text) < 32768:
                raise CsvReplayError(f"line {n}: pid {pid_text[:20]!r} is not a pid below 32768")
            pkey = (key, int(pid_text))
            procs[pkey].append((t, _number(row.get("proc.memory", ""), "used_memory", n)))
            if row.get("process"):
                names[pkey] = row["process"][:64]
            continue
        gpu = gpus.setdefault(key, _Gpu())
        gpu.name = row.get("name") or gpu.name
        gpu.uuid = row.get("uuid") or gpu.uuid
        values = {c: v for c in NUMERIC & row.keys() if (v := _number(row[c], c, n)) is not None}
        if "memory.total" in values:
            gpu.total_mib = values.pop("memory.total")
        gpu.rows.append((t, values))
        if len(gpus) > MAX_SIM_GPUS:
            raise CsvReplayError(f"line {n}: more than {MAX_SIM_GPUS} GPUs")
    if not times:
        raise CsvReplayError("no data rows")
    start, end = min(times), max(times)
    if end - start > MAX_SECONDS:
        raise CsvReplayError(f"the log spans {end - start:.0f} s, more than {MAX_SECONDS} s")
    return CsvLog(gpus, dict(procs), names, start, end)


def _per_second(rows: list[tuple[float, float | None]], start: float, seconds: int) -> list[float | None]:
    """The last reading at or before each second (the first one before it); None where there is none yet."""
    out: list[float | None] = []
    i, last = 0, None
    rows = sorted(rows, key=lambda r: r[0])
    for k in range(seconds):
        while i < len(rows) and rows[i][0] <= start + k + 1e-6:
            if rows[i][1] is not None:
                last = rows[i][1]
            i += 1
        out.append(last)
    first = next((v for v in out if v is not None), None)
    return [first if v is None else v for v in out] if first is not None else []


def scenario_from_log(log: CsvLog, source: str) -> Scenario:
    seconds = math.floor(log.end - log.start) + 1
    keys = sorted(log.gpus) or sorted({k for k, _ in log.procs})
    slots = {k: i for i, k in enumerate(keys)}
    devices: dict[str | int, dict[str, Any]] = {}
    timeline: list[dict[str, Any]] = []
    for key, slot in slots.items():
        gpu = log.gpus.get(key, _Gpu())
        dev: dict[str, Any] = {}
        if gpu.name:
            dev["name"] = gpu.name[:96]
        if gpu.total_mib is None:  # csv04 logs no total: the used memory must fit, at least
            used = [v.get("memory.used", 0.0) for _, v in gpu.rows]
            gpu.total_mib = max([24564.0, *used])
        dev["memory"] = {"total": int(gpu.total_mib * MIB)}
        # A log has no link state; the stand-in's default is an idle GPU's downshifted link, which under the log's
        # load would read as a degraded link. A busy GPU trains its link to the maximum.
        dev["pcie"] = {"gen": 4, "width": 16}
        devices[slot] = dev
        for column, (target, factor) in TARGETS.items():
            series = _per_second([(t, v.get(column)) for t, v in gpu.rows], log.start, seconds)
            if series:
                values = [round(x * factor) for x in series if x is not None]
                timeline.append({"at": 0, "series": {"path": f"devices[{slot}].{target}", "values": values}})
    for (key, pid), rows in sorted(log.procs.items()):
        slot = slots[key]
        first, last = min(t for t, _ in rows) - log.start, max(t for t, _ in rows) - log.start
        mem = _per_second(rows, log.start, seconds)
        timeline.append({"at": math.floor(first), "add_process": {
            "gpu": slot, "pid": pid, "name": log.names.get((key, pid), "unknown"),
            "used_memory": round((mem[math.floor(first)] or 0) * MIB) if mem else None}})
        if mem:
            values = [round((v or 0) * MIB) for v in mem[math.floor(first):]]
            path = f"devices[{slot}].processes.compute[pid={pid}].used_memory"
            timeline.append({"at": math.floor(first), "series": {"path": path, "values": values}})
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
