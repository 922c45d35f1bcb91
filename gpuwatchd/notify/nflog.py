"""The notification log's decision: what a receiver was last told about a group, and whether it must hear again.

Alertmanager's nflog entry and ``DedupStage.needsUpdate``. Pure: no I/O, no clock (``now`` is passed in); the
entries (``LogEntry``, kept with the stored log in ``notify/store/nflog.py``) are persisted by the outbox.
"""

from __future__ import annotations

from gpuwatchd.notify.store.nflog import LogEntry


def needs_update(
    entry: LogEntry | None,
    firing: frozenset[str],
    resolved: frozenset[str],
    *,
    send_resolved: bool,
    repeat_interval: float,
    now: float,
) -> str | None:
    """Alertmanager's ``DedupStage.needsUpdate``; returns the notification reason, or None for "nothing to send"."""
    if entry is None:
        return "first notification" if firing else None
    if not firing <= entry.firing:
        return "new alerts added"
    if not firing:
        # Sent even with send_resolved=false so the log forgets the firing set; the receiver knew nothing of
        # alerts that fired and resolved between two sends.
        return "all alerts resolved" if entry.firing else None
    if send_resolved and not resolved <= entry.resolved:
        return "some alerts resolved"
    if entry.timestamp <= now - repeat_interval:
        return "repeat interval elapsed"
    return None
