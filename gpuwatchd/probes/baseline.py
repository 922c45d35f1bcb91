"""Per-GPU baselines: the median of each measure's first N healthy runs, kept in the state dir across restarts.

Keyed by GPU UUID (never index: indices move when docks come and go), then ``probe.measure``. A measure's
baseline is only judged against once N values are in; until then the GPU is "building its baseline". The file is
rewritten atomically after each change; an unreadable or malformed file is set aside (``.corrupt``) and the
baselines rebuilt from the next runs, with one log line and ``gpuwatchd_probe_baseline_resets_total``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from gpuwatchd.state_files import read_json, set_aside

log = logging.getLogger(__name__)

FILE_NAME = "probe-baselines.json"
VERSION = 1
# Bounds of a file the daemon wrote itself (a hostile or damaged one is set aside): GPUs ever seen on the host,
# measures per GPU, values per measure (probes.baseline_runs is validated far below this).
MAX_GPUS = 1024
MAX_MEASURES = 64
MAX_RUNS = 1000


class Baselines:
    def __init__(self, path: Path | None, runs: int) -> None:
        self.path = path
        self.runs = max(1, runs)
        self.resets = 0  # corrupt files found and rebuilt
        self._values: dict[str, dict[str, list[float]]] = {}
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            data = read_json(path)
            if data is None:
                return
            values = _validate(data)
        except ValueError as e:  # StateFileError included: unreadable, too large, not UTF-8, not JSON, too deep
            self._corrupt(path, str(e)[:200])
            return
        self._values = values

    def _corrupt(self, path: Path, why: str) -> None:
        self.resets += 1
        aside = set_aside(path)
        kept = f"; the old file is kept as {aside}" if aside is not None else ""
        log.warning("probe baselines in %s are unusable (%s): rebuilding them from the next runs%s", path, why, kept)

    def baseline(self, uuid: str, key: str) -> float | None:
        """The median of the first N values, once there are N."""
        vals = self._values.get(uuid, {}).get(key, [])
        return statistics.median(vals[: self.runs]) if len(vals) >= self.runs else None

    def count(self, uuid: str, key: str) -> int:
        return len(self._values.get(uuid, {}).get(key, []))

    def building(self, uuid: str) -> bool:
        """No complete baseline yet for some measure of this GPU (or none at all)."""
        per = self._values.get(uuid)
        return not per or any(len(v) < self.runs for v in per.values())

    def add(self, uuid: str, measures: dict[str, float]) -> None:
        """Take the measures of a healthy run while the baseline of each is still being built."""
        changed = False
        per = self._values.setdefault(uuid, {})
        for key, value in measures.items():
            vals = per.setdefault(key, [])
            if len(vals) < self.runs:
                vals.append(float(value))
                changed = True
        if changed:
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        data = {"version": VERSION, "runs": self.runs, "gpus": self._values}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("cannot save probe baselines to %s: %s (they stay in memory)", self.path, e.strerror or e)


def _validate(data: Any) -> dict[str, dict[str, list[float]]]:
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("gpus"), dict):
        raise ValueError(f"not a version-{VERSION} baseline file")
    out: dict[str, dict[str, list[float]]] = {}
    if len(data["gpus"]) > MAX_GPUS:
        raise ValueError(f"more than {MAX_GPUS} GPUs")
    for uuid, per in data["gpus"].items():
        if not isinstance(per, dict):
            raise ValueError(f"{uuid}: expected a mapping of measures")
        if len(per) > MAX_MEASURES:
            raise ValueError(f"{str(uuid)[:64]}: more than {MAX_MEASURES} measures")
        for key, vals in per.items():
            if not isinstance(vals, list) or len(vals) > MAX_RUNS or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf for v in vals
            ):
                raise ValueError(f"{uuid}.{key}: expected a list of positive numbers")
            out.setdefault(str(uuid), {})[str(key)] = [float(v) for v in vals]
    return out
