"""Label matchers as Alertmanager writes them: ``name="v"``, ``name!="v"``, ``name=~"re"``, ``name!~"re"``.

Used by routes, inhibit rules and silences. Regexes are fully anchored, like Alertmanager's, compiled once, and run
by RE2 (``google-re2``), Alertmanager's own engine: matching takes time linear in the label value whatever the
pattern, so a user's silence can never stall the event loop (Python's backtracking ``re`` takes exponential time on
patterns like ``(.|.)*X``, and no structural filter catches them all). RE2 refuses what it cannot run in linear
time (backreferences, lookaround), with a message saying so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import re2

MatchOp = Literal["=", "!=", "=~", "!~"]

_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|([^"\s]*))\s*$')
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
# Alertmanager's matcher unescaping (pkg/labels/parse.go): \n, \" and \\ are escapes; any other backslash is
# kept as written, so a regex's \d or \1 means what it says (\1 is then refused by RE2, not silently "1").
_UNESCAPE = {"n": "\n", '"': '"', "\\": "\\"}


def unquote(quoted: str) -> str:
    """The value of a quoted matcher value (without its quotes), unescaped as Alertmanager does."""
    return _ESCAPE.sub(lambda m: _UNESCAPE.get(m.group(1), m.group(0)), quoted)


def quote(value: str) -> str:
    """``value`` as a quoted matcher value that :func:`unquote` gives back exactly (non-ASCII and tabs as is)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclass(frozen=True)
class Matcher:
    """One label matcher; a missing label matches like the empty string (Alertmanager semantics)."""

    name: str
    op: MatchOp
    value: str
    _rx: ClassVar[Any]  # set per instance in __post_init__ (ClassVar keeps it out of the dataclass fields)

    def __post_init__(self) -> None:
        # The compiled RE2 pattern is an attribute, not a field: config dumps see name, op and value only.
        object.__setattr__(self, "_rx", compile_regex(self.value) if self.op in ("=~", "!~") else None)

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
        return f"{self.name}{self.op}{quote(self.value)}"


def parse_matcher(text: str) -> Matcher:
    """``severity="critical"`` -> Matcher; raises ValueError with the offending text."""
    m = _MATCHER.match(text)
    if not m:
        raise ValueError(f'invalid matcher {text!r}: expected name="value" (ops = != =~ !~)')
    quoted, bare = m.group(3), m.group(4)
    value = unquote(quoted) if quoted is not None else (bare or "")
    op: MatchOp = m.group(2)  # type: ignore[assignment]  # the regex only captures the four ops
    return Matcher(m.group(1), op, value)


def matches_all(matchers: Sequence[Matcher], labels: Mapping[str, str]) -> bool:
    """All matchers hold (an empty list matches everything)."""
    return all(m.matches(labels) for m in matchers)


# RE2's memory budget per pattern (its default is 8 MiB too): a pattern needing more, like a huge counted repeat,
# is refused at compile time instead of growing the daemon.
RE2_MAX_MEM = 8 << 20


def _options() -> Any:
    options = re2.Options()
    options.max_mem = RE2_MAX_MEM
    options.log_errors = False  # RE2 would print every refused pattern to stderr; the caller reports it once
    return options


_OPTIONS = _options()


def compile_regex(pattern: str) -> Any:
    """Compile a matcher regex with RE2; ValueError naming the pattern and RE2's reason if it refuses it."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as e:
        reason = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(
            f"invalid regex {pattern[:80]!r}: {reason} (RE2 syntax: no backreferences or lookaround)"
        ) from None


def check_regex_length(pattern: str, max_length: int) -> None:
    """Refuse a user regex longer than ``max_length`` (``notify.api.max_regex_length``): keeps stored rows and
    compiled programs small; matching time is linear whatever the pattern (RE2)."""
    if len(pattern) > max_length:
        raise ValueError(f"regex longer than {max_length} characters")
