"""Label matchers as Alertmanager writes them: ``name="v"``, ``name!="v"``, ``name=~"re"``, ``name!~"re"``.

Used by routes, inhibit rules and silences. Regexes are fully anchored, like Alertmanager's, and compiled once.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# The stdlib's own regex parser (``re._parser``, typed nowhere): the only exact way to see a pattern's structure.
# ``sre_parse``, its public alias, warns on import since Python 3.11.
_sre: Any = importlib.import_module("re._parser")

MatchOp = Literal["=", "!=", "=~", "!~"]

_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|([^"\s]*))\s*$')


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label matcher; a missing label matches like the empty string (Alertmanager semantics)."""

    name: str
    op: MatchOp
    value: str
    _rx: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.op in ("=~", "!~"):
            try:
                object.__setattr__(self, "_rx", re.compile(self.value))
            except re.error as e:
                raise ValueError(f"invalid regex {self.value!r}: {e}") from None

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this matcher."""
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        assert self._rx is not None  # set by __post_init__ for the regex ops
        hit = self._rx.fullmatch(v) is not None
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.name}{self.op}"{escaped}"'


def parse_matcher(text: str) -> Matcher:
    """``severity="critical"`` -> Matcher; raises ValueError with the offending text."""
    m = _MATCHER.match(text)
    if not m:
        raise ValueError(f'invalid matcher {text!r}: expected name="value" (ops = != =~ !~)')
    quoted, bare = m.group(3), m.group(4)
    value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else (bare or "")
    op: MatchOp = m.group(2)  # type: ignore[assignment]  # the regex only captures the four ops
    return Matcher(m.group(1), op, value)


def matches_all(matchers: Sequence[Matcher], labels: Mapping[str, str]) -> bool:
    """All matchers hold (an empty list matches everything)."""
    return all(m.matches(labels) for m in matchers)


# Constructs RE2 (Alertmanager's regex engine) refuses; Python's backtracking engine can take exponential time on
# them, or on a repeat of a repeat like ``(a+)+``. Names from ``re._constants``.
_REFUSED = {
    "GROUPREF": "backreferences are not supported",
    "GROUPREF_EXISTS": "conditional groups are not supported",
    "ASSERT": "lookaround is not supported",
    "ASSERT_NOT": "lookaround is not supported",
}
_REPEATS = {"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"}


def _children(op: str, av: Any) -> Iterable[Any]:
    """Sub-patterns of one parsed node."""
    if op in _REPEATS:
        return [av[2]]
    if op == "SUBPATTERN":
        return [av[3]]
    if op == "BRANCH":
        return list(av[1])
    if op == "ATOMIC_GROUP":
        return [av]
    return []


def _has_repeat(pattern: Any) -> bool:
    for op_, av in pattern:
        op = str(op_)
        if op in _REPEATS and av[1] > 1:
            return True
        if any(_has_repeat(c) for c in _children(op, av)):
            return True
    return False


def _check(pattern: Any) -> None:
    for op_, av in pattern:
        op = str(op_)
        if op in _REFUSED:
            raise ValueError(_REFUSED[op])
        if op in _REPEATS and av[1] == _sre.MAXREPEAT and _has_repeat(av[2]):
            raise ValueError("nested quantifier (like (a+)+) can take exponential time")
        for c in _children(op, av):
            _check(c)


def check_regex_safety(pattern: str, max_length: int) -> None:
    """Refuse a user regex that could stall the evaluation loop: too long, nested unbounded repeats, or RE2-less
    constructs (backreferences, lookaround). Raises ValueError saying which.

    The stdlib has no linear-time engine and no match timeout, so this is a structural filter, not a proof: with
    the length cap and the short label values it runs on, it keeps each match cheap in practice.
    """
    if len(pattern) > max_length:
        raise ValueError(f"regex longer than {max_length} characters")
    try:
        parsed = _sre.parse(pattern)
    except re.error as e:
        raise ValueError(f"invalid regex {pattern!r}: {e}") from None
    _check(parsed)
