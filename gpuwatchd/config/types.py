"""Building blocks of config sections, shared by every subsystem's own section."""

from __future__ import annotations

import re
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """``"90s"``, ``"5m"``, ``"1.5h"``, ``"250ms"`` or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 30s, 5m or 1h")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("duration must not be negative")
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return float(m.group(1)) * _UNIT[m.group(2)]
    raise ValueError(f"expected a duration like 30s, 5m or 1h, got {value!r}")


Duration = Annotated[float, BeforeValidator(parse_duration)]


class Section(BaseModel):
    """Base of every config section: unknown keys are errors (typos must not pass silently), values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)




def yaml_error_message(e: yaml.YAMLError) -> str:
    """``line 3, column 7: invalid YAML: <problem>`` for a parse error (config files and scenario files)."""
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}invalid YAML: {getattr(e, 'problem', None) or e}"
