"""Building records from stored rows: one bad row is skipped (one log line, counted), never the whole database.

A row can be unreadable though the file is sound: JSON cut short, a value of the wrong type, a regex the matcher
engine refuses (a silence stored by an older version). Anything that raises while building a record skips it; the
row stays in the file for inspection and is overwritten or expired like any other.
"""

from __future__ import annotations

import collections
import json
import logging
import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def build_all(
    rows: Iterable[dict[str, Any]],
    build: Callable[[dict[str, Any]], T],
    *,
    table: str,
    skipped: collections.Counter[str],
    where: object,
) -> list[T]:
    """``build`` each row; a row it raises on is logged once and counted in ``skipped[table]``."""
    out = []
    for r in rows:
        try:
            out.append(build(r))
        except Exception as e:  # any failure to build is a bad row, whatever the builder raised
            skipped[table] += 1
            key = {k: r.get(k) for k in ("id", "receiver", "group_key") if k in r}
            log.error("notification database %s: skipped unreadable %s row %s: %s", where, table, key, e)
    return out


def text(r: dict[str, Any], key: str) -> str:
    v = r[key]
    if not isinstance(v, str):
        raise ValueError(f"{key}: expected text, found {type(v).__name__}")
    return v


def number(r: dict[str, Any], key: str) -> float:
    v = r[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{key}: expected a finite number, found {v!r}")
    return float(v)


def integer(r: dict[str, Any], key: str) -> int:
    v = r[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key}: expected an integer, found {v!r}")
    return v


def string_set(r: dict[str, Any], key: str) -> frozenset[str]:
    """A JSON list of strings (alert fingerprints)."""
    v = json.loads(text(r, key))
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"{key}: expected a JSON list of strings")
    return frozenset(v)
