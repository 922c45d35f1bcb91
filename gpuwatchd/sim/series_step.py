"""The scenario ``series`` step: a field follows a recorded series, one value per ``every`` seconds.

A trace of real memory (``nvidia-smi -l 1``) is thousands of points; as ``set`` steps it would be thousands of
timeline entries. A ``series`` step holds them as one list, inline or in a file::

    - at: 0
      series: {path: "devices[0].memory.used", every: 1, values: [1129MiB, 1123MiB, 17.4GiB]}
    - at: 0
      series: {path: "devices[0].processes.compute[pid=4242].used_memory", file: traces/job.txt}

A file holds one value per line (numbers or sizes like ``1.5GiB``; blank lines and ``#`` comments skipped); a
relative path is taken from the directory the simulation runs in. Before its first value the field keeps what
the scenario gave it; after the last one the last value holds.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuwatchd.config.files import InputFileError, read_text_file
from gpuwatchd.sim.scenario_fields import parse_quantity

MAX_NUMBER = float(2**64)  # as every number of a scenario (sim/scenario.py)
MAX_VALUES = 1_000_000  # eleven and a half days at 1 s
MAX_FILE_BYTES = 32 * 1024 * 1024


def series_number(value: Any, where: str) -> float:
    if isinstance(value, str):  # a file's lines are text: "1048576" is bytes, as 1048576 is in a list
        value = value.strip()
        try:
            if not value.isascii() or len(value) > 40:  # float() takes any script's digits and any length
                raise ValueError(value)
            value = float(value)
        except ValueError:
            value = parse_quantity(value)
    v = parse_quantity(value)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or abs(v) > MAX_NUMBER:
        shown = value if not isinstance(value, str) or len(value) <= 40 else f"{value[:40]}..."
        raise ValueError(f"{where}: expected a number or a size like 4GiB of at most 2**64, got {shown!r}")
    return float(v)


class SeriesSpec(BaseModel):
    """``path`` follows ``values`` (or the values in ``file``), one per ``every`` seconds from the step's ``at``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    path: str
    every: float = Field(default=1.0, gt=0, le=86400)
    values: tuple[float, ...] = ()
    file: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _load(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if (data.get("values") is None) == (data.get("file") is None):
            raise ValueError("give exactly one of values (a list) or file (one value per line)")
        if data.get("file") is not None:
            data["values"] = _read_values(str(data["file"]))
        raw = data["values"]
        if not isinstance(raw, list | tuple) or not raw:
            raise ValueError("values: expected a non-empty list")
        if len(raw) > MAX_VALUES:
            raise ValueError(f"values: {len(raw)} values, more than {MAX_VALUES}")
        data["values"] = tuple(series_number(v, f"values[{i}]") for i, v in enumerate(raw))
        return data

    @property
    def span(self) -> float:
        return len(self.values) * self.every


def _read_values(name: str) -> list[str]:
    try:
        text = read_text_file(Path(name), max_bytes=MAX_FILE_BYTES)
    except (InputFileError, OSError) as e:
        raise ValueError(f"file {name}: {e}") from None
    out: list[str] = []
    start = 0
    # line by line without a list of every line (16M short lines fit in 32 MiB); one past the limit is enough
    while start < len(text) and len(out) <= MAX_VALUES:
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        value = text[start:end].split("#", 1)[0].strip()
        if value:
            out.append(value)
        start = end + 1
    return out


def series_value(spec: SeriesSpec, dt: float) -> float:
    """The series' value ``dt`` seconds after its step (the first value before, the last one after)."""
    i = int(dt // spec.every)
    return spec.values[min(len(spec.values) - 1, max(0, i))]
