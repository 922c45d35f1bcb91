"""One doctor check's result, and the report: one line per check, the fix under every warn and fail, exit code."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

Status = Literal["pass", "warn", "fail"]
EXIT_BY_STATUS: dict[Status, int] = {"pass": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True, slots=True)
class Result:
    """One check: ``group`` (driver, devices, gpu N, cuda, daemon), what was found, and how to fix a warn/fail."""

    group: str
    check: str
    status: Status
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status != "pass" and not self.fix:
            raise ValueError(f"{self.check}: a {self.status} needs a fix line")


def ok(group: str, check: str, detail: str) -> Result:
    return Result(group, check, "pass", detail)


def warn(group: str, check: str, detail: str, fix: str) -> Result:
    return Result(group, check, "warn", detail, fix)


def fail(group: str, check: str, detail: str, fix: str) -> Result:
    return Result(group, check, "fail", detail, fix)


def exit_code(results: Sequence[Result]) -> int:
    """0 all pass, 1 any warn, 2 any fail."""
    return max((EXIT_BY_STATUS[r.status] for r in results), default=0)


def render_text(results: Sequence[Result]) -> str:
    """``[PASS] driver  kernel module: nvidia 550.54.14 loaded`` lines; ``      fix: ...`` under warn and fail."""
    lines: list[str] = []
    for r in results:
        # Details quote what others wrote (the daemon's answer, sysfs names, version files): terminal-safe.
        lines.append(_safe(f"[{r.status.upper()}] {r.group}: {r.check}: {r.detail}"))
        if r.fix:
            lines.append(_safe(f"       fix: {r.fix}"))
    counts = {s: sum(1 for r in results if r.status == s) for s in EXIT_BY_STATUS}
    lines.append(f"{counts['pass']} passed, {counts['warn']} warnings, {counts['fail']} failed")
    return "\n".join(lines)


def _safe(text: str) -> str:
    """Each line of ``text`` with escape sequences, CR and bidi controls shown as ``?`` (runtime/terminal.py)."""
    from gpuwatchd.runtime.terminal import terminal_safe

    return "\n".join(terminal_safe(line, 4000) for line in text.split("\n"))


def render_json(results: Sequence[Result]) -> str:
    return json.dumps(
        {"exit_code": exit_code(results), "checks": [asdict(r) for r in results]}, indent=2, sort_keys=True
    )
