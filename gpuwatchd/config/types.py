"""Building blocks of config sections, shared by every subsystem's own section."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path, PurePath
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, field_validator

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
# Longest duration any key takes: a year. Timers and deadlines are computed as now + duration, and asyncio refuses
# (OverflowError) or never wakes on astronomically large ones; nothing a host monitor waits for is longer.
MAX_DURATION = 366 * 86400.0
MIN_POSITIVE_DURATION = 0.001
_PATH_MAX = 4096  # Linux PATH_MAX and NAME_MAX
_NAME_MAX = 255


def parse_duration(value: Any) -> float:
    """``"90s"``, ``"5m"``, ``"1.5h"``, ``"250ms"`` or a number of seconds -> seconds (finite, 0 to a year)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 30s, 5m or 1h")
    seconds: float | None = None
    if isinstance(value, int | float):
        seconds = float(value) if not isinstance(value, int) or abs(value) < 1 << 64 else math.inf
    elif isinstance(value, str) and len(value) <= 64:
        m = _DURATION.match(value)
        if m:
            seconds = float(m.group(1)) * _UNIT[m.group(2)]
    if seconds is None:
        shown = repr(value) if len(repr(value)) <= 64 else repr(value)[:60] + "..."
        raise ValueError(f"expected a duration like 30s, 5m or 1h, got {shown}")
    if math.isnan(seconds):
        raise ValueError("expected a duration like 30s, 5m or 1h, got NaN")
    if seconds < 0:
        raise ValueError("duration must not be negative")
    if seconds > MAX_DURATION:
        raise ValueError("duration too long (at most 366d)")
    return seconds


def positive_duration(value: Any) -> float:
    """A duration that must be > 0 (a step, a window, an interval: zero divides by zero or spins), at least 1 ms."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError("must be greater than 0")
    if seconds < MIN_POSITIVE_DURATION:  # a timer period this short is a busy loop, not a schedule
        raise ValueError("must be at least 1ms")
    return seconds


def check_path(value: Any) -> Any:
    """A path key: no NUL byte (the OS cannot take it) and within the OS limits (4096 bytes, 255 per name)."""
    text = str(value) if isinstance(value, str | PurePath) else None
    if text is not None:
        if "\0" in text:
            raise ValueError("path contains a NUL byte")
        if len(os.fsencode(text)) > _PATH_MAX or any(len(os.fsencode(p)) > _NAME_MAX for p in text.split("/")):
            raise ValueError(f"path too long (at most {_PATH_MAX} bytes, {_NAME_MAX} per name)")
    return value


Duration = Annotated[float, BeforeValidator(parse_duration)]
PositiveDuration = Annotated[float, BeforeValidator(positive_duration)]
# A path key; Section checks every path value the same way, this says so in the signature.
SafePath = Annotated[Path, BeforeValidator(check_path)]


class Section(BaseModel):
    """Base of every config section: unknown keys are errors (typos must not pass silently), values frozen.

    No float key takes ``.inf`` or ``.nan``: every comparison with NaN is false, so a NaN threshold silently
    disables its rule, and an infinite one never fires or overflows timer arithmetic.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _paths(cls, v: Any) -> Any:
        # Every path key, in every section (present and future): no NUL byte, within the OS limits.
        return check_path(v) if isinstance(v, PurePath) else v




def yaml_error_message(e: yaml.YAMLError) -> str:
    """``line 3, column 7: invalid YAML: <problem>`` for a parse error (config files and scenario files), one line."""
    if isinstance(e, yaml.reader.ReaderError):  # a character YAML does not allow (NUL, other control characters)
        code = ord(e.character) if isinstance(e.character, str) else int(e.character)
        return f"character {e.position + 1}: invalid YAML: unacceptable character #x{code:04x}"
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = " ".join(str(getattr(e, "problem", None) or e).split())
    return f"{where}invalid YAML: {problem}"


# A file with thousands of wrong keys gets the first ten and a count, not thousands of lines.
MAX_PROBLEMS_SHOWN = 10


def problem_lines(source: str, problems: list[str]) -> str:
    """``source: problem`` per line, at most ``MAX_PROBLEMS_SHOWN`` of them and then how many more there are."""
    shown = [f"{source}: {p}" for p in problems[:MAX_PROBLEMS_SHOWN]]
    if len(problems) > MAX_PROBLEMS_SHOWN:
        shown.append(f"{source}: ... and {len(problems) - MAX_PROBLEMS_SHOWN} more problems")
    return "\n".join(shown)
