"""Alert fingerprints, memoised: the dispatcher, inhibition and the API ask for them on every evaluation."""

from __future__ import annotations

from functools import lru_cache

from gpuwatchd.model import Alert, fingerprint


@lru_cache(maxsize=8192)
def _fingerprint(items: tuple[tuple[str, str], ...]) -> str:
    return fingerprint(dict(items))


def alert_fp(alert: Alert) -> str:
    """``alert.fingerprint``, memoised: the model's pure-Python FNV hash costs ~40 us and the dispatcher asks often."""
    return _fingerprint(tuple(sorted(alert.labels.items())))
