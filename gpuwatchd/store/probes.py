"""What the probes found, for the rules, the exporter and ``gpuwatchd status``: counters and last results.

Held by the store (``Store.probes``) so the rule family and the collectors read it like any other store data;
written only by the probe service on the daemon's loop. No I/O, no torch. The values it holds are in
``gpuwatchd.model.probes``.
"""

from __future__ import annotations

from collections import Counter

from gpuwatchd.model.probes import ProbeRecord, Verdict


class ProbeLedger:
    def __init__(self) -> None:
        self.available: bool | None = None  # None: not checked yet
        self.unavailable_reason: str | None = None
        self.runs: Counter[tuple[str, str, str]] = Counter()  # (uuid, probe, result)
        self.skipped: Counter[tuple[str, str]] = Counter()  # (uuid, reason)
        self.baseline_resets = 0
        self.last: dict[tuple[str, str], ProbeRecord] = {}
        self.previous: dict[tuple[str, str], ProbeRecord] = {}
        self.verdicts: dict[str, Verdict] = {}
        self.building: dict[str, bool] = {}  # uuid -> some baseline still being built
        self.version = 0

    def set_available(self, available: bool, reason: str | None) -> None:
        self.available, self.unavailable_reason = available, None if available else reason
        self.version += 1

    def skip(self, uuid: str, reason: str, now: float) -> None:
        self.skipped[(uuid, reason)] += 1
        last = self.verdicts.get(uuid)
        if last is None or last.verdict.startswith("skipped"):
            self.verdicts[uuid] = Verdict(f"skipped ({reason})", now)
        self.version += 1

    def record(self, records: list[ProbeRecord], *, building: bool = False) -> None:
        """The records of one run (one per probe, or one ``worker`` record)."""
        for rec in records:
            key = (rec.uuid, rec.probe)
            self.runs[(rec.uuid, rec.probe, rec.result)] += 1
            if rec.result in ("oom", "cancelled"):
                continue  # not a verdict on the GPU: the last real result stands
            if key in self.last:
                self.previous[key] = self.last[key]
            self.last[key] = rec
            if rec.probe != "worker" and rec.success:
                # A good run of any probe clears a whole-run failure: the worker got through.
                w = (rec.uuid, "worker")
                if w in self.last and not self.last[w].success:
                    self.previous[w] = self.last[w]
                    self.last[w] = ProbeRecord(rec.uuid, "worker", "pass", rec.timestamp, 0.0)
        if records:
            self.verdicts[records[0].uuid] = _summary(records, building)
        self.version += 1

    def for_gpu(self, uuid: str) -> list[ProbeRecord]:
        return [r for (u, _), r in sorted(self.last.items()) if u == uuid]


def _summary(records: list[ProbeRecord], building: bool) -> Verdict:
    t = max(r.timestamp for r in records)
    bad = [r for r in records if not r.success]
    if bad:
        return Verdict("FAILED", t, "; ".join(f"{r.probe}: {r.problem}" for r in bad))
    if all(r.result == "cancelled" for r in records):
        return Verdict("skipped (cancelled: a job started)", t)
    if all(r.result == "oom" for r in records):
        return Verdict("skipped (out of memory)", t)
    slow = [r for r in records if r.result == "degraded"]
    if slow:
        return Verdict("degraded", t, "; ".join(d for r in slow for d in r.degraded.values()))
    return Verdict("pass (building baseline)" if building else "pass", t)
