"""Silence fields are validated the same way from the API and from the database: a stored row that does not pass
(older version, damage, a pattern RE2 refuses) is skipped with one log line, and never breaks a listing."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from gpuwatchd.notify.silence_input import SilenceError, check_window, parse_matchers_json, parse_time
from gpuwatchd.notify.silences import Silences, silence_json
from gpuwatchd.notify.store import StateStore

NOW = 1_800_000_000.0
GOOD = json.dumps([{"name": "uuid", "op": "=", "value": "GPU-1"}])
BAD_ROWS = {
    "minus-inf-start": (GOOD, -math.inf, NOW + 60, "ops", ""),  # SQLite stores NaN as NULL, infinities as is
    "inf-end": (GOOD, NOW, math.inf, "ops", ""),
    "far-future": (GOOD, NOW, 1e15, "ops", ""),
    "ends-before-starts": (GOOD, NOW, NOW - 60, "ops", ""),
    "backreference": (json.dumps([{"name": "uuid", "op": "=~", "value": "(x)\\1"}]), NOW, NOW + 60, "ops", ""),
    "bad-op": (json.dumps([{"name": "uuid", "op": "~~", "value": "x"}]), NOW, NOW + 60, "ops", ""),
    "bad-name": (json.dumps([{"name": "u u", "op": "=", "value": "x"}]), NOW, NOW + 60, "ops", ""),
    "not-json": ("[{", NOW, NOW + 60, "ops", ""),
    "no-matchers": ("[]", NOW, NOW + 60, "ops", ""),
    "matchers-not-list": ('{"a": 1}', NOW, NOW + 60, "ops", ""),
    "huge-comment": (GOOD, NOW, NOW + 60, "ops", "c" * 10_000),
    "text-start": (GOOD, "soon", NOW + 60, "ops", ""),
}


async def test_invalid_stored_silences_are_skipped_once_and_listing_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = StateStore(tmp_path)
    for sid, (matchers, starts, ends, by, comment) in BAD_ROWS.items():
        state.silences.save(
            sid.replace("-", ""),
            matchers,
            starts_at=starts,
            ends_at=ends,
            created_by=by,
            comment=comment,
            now=NOW,  # type: ignore[arg-type]
        )
    state.silences.save("good1", GOOD, starts_at=NOW, ends_at=NOW + 60, created_by="ops", comment="", now=NOW)
    await state.outbox.drain()
    state.close()

    with caplog.at_level(logging.WARNING, logger="gpuwatchd.notify.silences"):
        state = StateStore(tmp_path)
        silences = Silences(state.silences)
    try:
        assert silences.skipped == len(BAD_ROWS) == state.skipped["silences"]
        skipped = [r for r in caplog.records if "skipped stored silence" in r.getMessage()]
        assert len(skipped) == len(BAD_ROWS) and all("\n" not in r.getMessage() for r in skipped)
        listing = silences.listing(NOW)
        assert [s.id for s in listing] == ["good1"]
        assert [silence_json(s, NOW)["status"]["state"] for s in listing] == ["active"]
    finally:
        state.close()


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "NaN", "", "2026-13-01T00:00:00Z", [], None, True])
def test_times_must_be_finite_rfc3339_or_seconds(value: object) -> None:
    with pytest.raises(SilenceError) as e:
        parse_time(value, "startsAt")
    assert e.value.field == "startsAt"


def test_rfc3339_and_seconds_agree() -> None:
    assert parse_time("2027-01-15T08:00:00Z", "startsAt") == parse_time(1_800_000_000, "startsAt")
    assert parse_time("2027-01-15T09:00:00+01:00", "startsAt") == 1_800_000_000.0


@pytest.mark.parametrize(
    ("starts", "ends", "field"),
    [
        (NOW, NOW, "endsAt"),
        (NOW, 1e15, "endsAt"),
        (1.0, 2.0, "startsAt"),
        (NOW + 400 * 86400, NOW + 401 * 86400, "startsAt"),
    ],
)
def test_window_bounds(starts: float, ends: float, field: str) -> None:
    with pytest.raises(SilenceError) as e:
        check_window(starts, ends, NOW)
    assert e.value.field == field


def test_matcher_objects_need_real_booleans_and_bounded_parts() -> None:
    for bad in (
        {"name": "uuid", "value": "x", "isEqual": 0},
        {"name": "uuid", "value": "x" * 2000},
        {"name": "n" * 200, "value": "x"},
        {"name": "uuid", "value": 5},
    ):
        with pytest.raises(SilenceError, match=r"^matchers\[0\]: "):
            parse_matchers_json([bad])
    m, _ = parse_matchers_json(
        [{"name": "uuid", "value": "GPU-.*", "isRegex": True, "isEqual": False}, {"name": "gpu", "value": "0"}]
    )
    assert m.op == "!~" and m.matches({"uuid": "other"}) and not m.matches({"uuid": "GPU-1"})
