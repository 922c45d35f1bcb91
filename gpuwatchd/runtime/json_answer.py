"""The JSON answers of a daemon, read by every client command (``status``, ``status --watch``, ``silence``, ``notify
test --url``, ``probe``, ``doctor``) within bounds, and their shape checked before anything renders them.

Whatever answers at ``--url`` may be hostile or broken. Parsed as it came, ``[`` x 100k raised ``RecursionError``
(a traceback in every client), a 60 MB answer took 3.4 GiB, and ``{"gpus": 5}`` raised ``TypeError`` deep in a
renderer. So an answer is read up to a byte cap, scanned once (linearly, strings skipped) for its nesting depth and
its number of values, and only then decoded; a document of the wrong shape is refused by :func:`check_shape`. Each
refusal is an :class:`AnswerError` whose text ends the command in one line: "the daemon at URL answered something
that is not a gpuwatchd status (...)".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

# The largest status a daemon sends: 64 GPUs with top-N processes each and the page's histories is ~1 MiB; a
# silence list of max_silences with 4 KiB comments a few MiB.
MAX_ANSWER_BYTES = 16 << 20
# gpuwatchd's documents nest 6 deep (status > gpus > [] > processes > [] > owner); 32 leaves room and stays far
# below the C decoder's recursion limit.
MAX_DEPTH = 32
# Values (containers and elements) in one answer: ~1M small ones are ~100 MB once decoded; a real status has a few
# thousand. A 16 MiB answer of "[{},{},...]" would otherwise be 5M dicts (~350 MB).
MAX_VALUES = 1_000_000
# Strings or one structural character; a string that never closes runs to the end (one pass, see notify/json_body).
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[\[\]{},]', re.DOTALL)


# What rendering a document of the checked shape can still raise on a value of the wrong type deeper down (a number
# where a name is, a string where a list is): the commands turn it into the one "not a gpuwatchd status" line.
RENDER_ERRORS = (TypeError, AttributeError, KeyError, ValueError, IndexError, OverflowError)


class AnswerError(ValueError):
    """An answer that is not the JSON document asked for; ``str`` is one line for the user."""


class _Stream(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


def not_gpuwatchd(url: str, what: str, why: str) -> str:
    """The one line that says something at ``url`` is not a gpuwatchd daemon, and why."""
    return f"the daemon at {url} answered something that is not a gpuwatchd {what} ({why})"


def check_bounds(raw: bytes, *, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES) -> str | None:
    """Why ``raw`` is refused before decoding (too deep, too many values), or None (linear; strings skipped)."""
    depth = 0
    values = 0
    for m in _TOKENS.finditer(raw):
        tok = m.group()
        if tok in (b"[", b"{"):
            depth += 1
            values += 1
            if depth > max_depth:
                return f"JSON nested deeper than {max_depth}"
        elif tok in (b"]", b"}"):
            depth -= 1
        elif tok == b",":
            values += 1
        if values > max_values:
            return f"more than {max_values} JSON values"
    return None


def parse_answer(raw: bytes, *, max_bytes: int = MAX_ANSWER_BYTES) -> Any:
    """The JSON document of an answer's body; :class:`AnswerError` (the reason only) when it is not one."""
    if len(raw) > max_bytes:
        raise AnswerError(f"larger than {max_bytes >> 20} MiB")
    problem = check_bounds(raw)
    if problem is not None:
        raise AnswerError(problem)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise AnswerError("not JSON") from None


def json_objects(text: str, *, max_line_bytes: int = 1 << 20) -> Iterator[dict[str, Any]]:
    """The lines of a child's output that are JSON objects, each within the bounds of :func:`parse_answer` (a
    foreign interpreter's line nested 100k deep is skipped like any other line that is not one)."""
    for line in text.splitlines():
        raw = line.encode("utf-8", "replace")
        if not raw.lstrip().startswith(b"{") or len(raw) > max_line_bytes:
            continue
        try:
            doc = parse_answer(raw, max_bytes=max_line_bytes)
        except AnswerError:
            continue
        if isinstance(doc, dict):
            yield doc


async def read_answer(stream: _Stream, *, max_bytes: int = MAX_ANSWER_BYTES) -> Any:
    """:func:`parse_answer` of a body read up to ``max_bytes`` (+1, to see that it is larger)."""
    from gpuwatchd.runtime.http_body import read_capped

    return parse_answer(await read_capped(stream, max_bytes + 1), max_bytes=max_bytes)


# The containers the clients read, by key: a present key must hold this type (null allowed where the daemon sends it).
Shape = Mapping[str, "type | tuple[type, ...] | ShapeList"]


class ShapeList:
    """A list whose items are objects of ``item`` shape (``None``: any object)."""

    def __init__(self, item: Shape | None = None) -> None:
        self.item = item


_PROCESS: Shape = {"owner": (dict, type(None)), "memory_trend": (dict, type(None))}
_GPU: Shape = {
    "readings": (dict, type(None)), "processes": ShapeList(_PROCESS), "errors": (dict, type(None)),
    "probe": (dict, type(None)), "health": (dict, type(None)), "link": (dict, type(None)),
    "dock": (dict, type(None)), "memory_history": list,
}
STATUS_SHAPE: Shape = {
    "nvml": dict, "daemon": dict, "gpus": ShapeList(_GPU), "links": ShapeList(), "sources": dict,
    "xid_counts": ShapeList(), "recent_xids": ShapeList(), "pods": ShapeList(), "config": dict, "docks": ShapeList(),
    "probe_results": (list, dict), "receivers": (list, dict), "probes": (dict, type(None)), "scenario": dict,
}
SILENCE_SHAPE: Shape = {"status": dict, "matchers": ShapeList()}


def check_shape(doc: Any, shape: Shape, where: str = "") -> str | None:
    """Why ``doc`` (an object) does not have ``shape``, or None."""
    if not isinstance(doc, dict):
        return f"{where or 'the answer'} is not a JSON object"
    for key, want in shape.items():
        if key not in doc:
            continue
        value = doc[key]
        at = f"{where}.{key}" if where else key
        if isinstance(want, ShapeList):
            if not isinstance(value, list):
                return f"{at} is not a list"
            for i, item in enumerate(value):
                problem = check_shape(item, want.item or {}, f"{at}[{i}]")
                if problem is not None:
                    return problem
        elif not isinstance(value, want):
            return f"{at} is not {_kind(want)}"
    return None


def _kind(want: type | tuple[type, ...]) -> str:
    names = {dict: "an object", list: "a list", type(None): "null", str: "a string", int: "a number"}
    kinds = want if isinstance(want, tuple) else (want,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)
