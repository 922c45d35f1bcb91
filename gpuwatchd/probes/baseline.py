"""Per-GPU baselines: the median of each measure's first N healthy runs, kept in the state dir across restarts.

Keyed by GPU UUID (never index: indices move when docks come and go), then ``probe.measure``. A measure's
baseline is only judged against once N values are in; until then the GPU is "building its baseline". The file is
rewritten atomically after each change; an unreadable or malformed file is set aside (``.corrupt``) and the
baselines rebuilt from the next runs, with one log line and ``gpuwatchd_probe_baseline_resets_total``.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FILE_NAME = "probe-baselines.json"
VERSION = 1


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
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except OSError as e:
            self._corrupt(path, f"cannot read it ({e.strerror})")
            return
        try:
            data = json.loads(text)
            values = _validate(data)
        except ValueError as e:
            self._corrupt(path, str(e))
            return
        self._values = values

    def _corrupt(self, path: Path, why: str) -> None:
        self.resets += 1
        aside = path.with_name(path.name + ".corrupt")
        try:
            os.replace(path, aside)
            kept = f"; the old file is kept as {aside}"
        except OSError:
            kept = ""
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
    for uuid, per in data["gpus"].items():
        if not isinstance(per, dict):
            raise ValueError(f"{uuid}: expected a mapping of measures")
        for key, vals in per.items():
            if not isinstance(vals, list) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in vals
            ):
                raise ValueError(f"{uuid}.{key}: expected a list of positive numbers")
            out.setdefault(str(uuid), {})[str(key)] = [float(v) for v in vals]
    return out
