"""Label matchers as Alertmanager writes them: ``name="v"``, ``name!="v"``, ``name=~"re"``, ``name!~"re"``.

Used by routes, inhibit rules and silences. Regexes are fully anchored, like Alertmanager's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

MatchOp = Literal["=", "!=", "=~", "!~"]

_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|([^"\s]*))\s*$')


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label matcher; a missing label matches like the empty string (Alertmanager semantics)."""

    name: str
    op: MatchOp
    value: str

    def __post_init__(self) -> None:
        if self.op in ("=~", "!~"):
            try:
                re.compile(self.value)
            except re.error as e:
                raise ValueError(f"invalid regex {self.value!r}: {e}") from None

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this matcher."""
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        hit = re.fullmatch(self.value, v) is not None
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
