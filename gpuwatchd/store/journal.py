"""What changed in the history rings since the last save of the rule history (``store/history_file.py``).

A ring only appends at its newest end and drops at its oldest, and all its points but the newest one or two are
settled (the same immutable objects until they age out). So a save need not re-read a ring: per ring the journal
keeps a mark, the last settled point it saved (``anchor``) and the points after it that it saved (``tail``), and
the next save reads the ring from its newest end back to the anchor. What it hands the writer per ring is an
``Entry``: drop the last ``drop`` points of the saved ring and append ``points``; or, when the anchor is gone (a new
ring, a pid reused after its ring expired, a first save), ``drop`` None: the ring is replaced by ``points``, its
whole history. Rings that no longer exist are listed as gone.

Per ring the journal holds two or three references to points the ring holds anyway (the newest may outlive its
ring's copy by one save): no second copy of the history. Reading is O(points added since the last save) per ring
plus O(rings), on the event loop; the encoding is the writer's, in a thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpuwatchd.store import GpuPoint, ProcessPoint, Store

P = TypeVar("P", GpuPoint, ProcessPoint)
K = TypeVar("K", str, tuple[str, int])


@dataclass(frozen=True, slots=True)
class Mark:
    anchor: object  # the newest settled point saved (None: none yet)
    tail: tuple[object, ...]  # the points saved after it, which could still change


@dataclass(frozen=True, slots=True)
class Entry(Generic[K, P]):
    key: K
    drop: int | None  # drop this many of the saved ring's newest points before appending; None: replace the ring
    points: Sequence[P]


@dataclass(slots=True)
class Delta:
    """One save's worth of changes, with the marks to keep once it is written."""

    full: bool
    gpus: list[Entry[str, GpuPoint]] = field(default_factory=list)
    procs: list[Entry[tuple[str, int], ProcessPoint]] = field(default_factory=list)
    gone_gpus: list[str] = field(default_factory=list)
    gone_procs: list[tuple[str, int]] = field(default_factory=list)
    gpu_marks: dict[str, Mark] = field(default_factory=dict)
    proc_marks: dict[tuple[str, int], Mark] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.gpus or self.procs or self.gone_gpus or self.gone_procs)


def _entry(key: K, mark: Mark | None, read: tuple[list[P], bool, int],
           out: list[Entry[K, P]], marks: dict[K, Mark]) -> None:
    points, found, unsettled = read
    n = len(points)
    if not found or mark is None:
        out.append(Entry(key, None, points))
    else:
        tail = mark.tail
        same = 0
        for a, b in zip(tail, points, strict=False):
            if a is not b:
                break
            same += 1
        if same == len(tail) == n:
            marks[key] = mark  # nothing new since the last save
            return
        out.append(Entry(key, len(tail) - same, points[same:]))
    if n > unsettled:
        marks[key] = Mark(points[n - unsettled - 1], tuple(points[n - unsettled:]))
    else:
        marks[key] = Mark(mark.anchor if found and mark is not None else None, tuple(points))


class Journal:
    """The marks of the last save that reached the disk."""

    def __init__(self) -> None:
        self._gpus: dict[str, Mark] = {}
        self._procs: dict[tuple[str, int], Mark] = {}

    def collect(self, store: Store, *, full: bool) -> Delta:
        """The changes since the last committed save; with ``full``, every ring whole (a file written afresh)."""
        delta = Delta(full)
        gmarks = {} if full else self._gpus
        pmarks = {} if full else self._procs
        for u in store.gpu_keys():
            mark = gmarks.get(u)
            _entry(u, mark, store.gpu_history_after(u, mark.anchor if mark else None), delta.gpus, delta.gpu_marks)
        for key in store.process_keys():
            pmark = pmarks.get(key)
            _entry(key, pmark, store.process_history_after(key[0], key[1], pmark.anchor if pmark else None),
                   delta.procs, delta.proc_marks)
        if not full:
            delta.gone_gpus = [u for u in gmarks if u not in delta.gpu_marks]
            delta.gone_procs = [k for k in pmarks if k not in delta.proc_marks]
        return delta

    def commit(self, delta: Delta) -> None:
        """``delta`` is on disk: the next save starts from it."""
        self._gpus = delta.gpu_marks
        self._procs = delta.proc_marks

    def reset(self) -> None:
        """Nothing saved is known (a failed write): the next save must write every ring."""
        self._gpus = {}
        self._procs = {}
