"""When to retry a send, how long to wait, and how fast one endpoint may be called.

One table decides retries for every integration (Alertmanager's ``notify.Retrier.Check``): 2xx success; 429 and
5xx retried (429 after the server's Retry-After / Discord's ``retry_after``); network errors and timeouts retried;
every other status is permanent. Alertmanager does not retry 429; the chat services all ask clients to.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Literal

Outcome = Literal["success", "retry", "permanent"]

# Never wait longer than this on a server's say-so: a bogus Retry-After must not park a receiver for days.
MAX_RETRY_AFTER_SECONDS = 3600.0
# Longest Retry-After text other than digits looked at: an HTTP-date is 29 characters; a longer one is no value.
MAX_RETRY_AFTER_CHARS = 64
_DECIMAL = re.compile(r"[0-9]{1,9}\.[0-9]{1,9}")
# Backoff growth per attempt and jitter share (cenkalti/backoff defaults used by Alertmanager: x1.5, +-50 %).
BACKOFF_MULTIPLIER = 1.5
BACKOFF_JITTER = 0.5


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do after one attempt: ``delay`` is the server-requested wait (None: use backoff)."""

    outcome: Outcome
    reason: str  # short, secret-free: "http_500", "http_429", "timeout", "connection"
    delay: float | None = None


def classify_status(status: int, headers: dict[str, str], body: bytes, now: float) -> Verdict:
    """Map an HTTP response to a verdict (header names are matched case-insensitively)."""
    if 200 <= status < 300:
        return Verdict("success", f"http_{status}")
    if status == 429:
        lower = {k.lower(): v for k, v in headers.items()}
        delay = retry_after_body(body)
        if delay is None:
            delay = parse_retry_after(lower.get("retry-after"), now)
        return Verdict("retry", "http_429", delay)
    if 500 <= status < 600:
        return Verdict("retry", f"http_{status}")
    return Verdict("permanent", f"http_{status}")


def parse_retry_after(value: str | None, now: float) -> float | None:
    """``Retry-After`` as delta-seconds or HTTP-date (RFC 9110 §10.2.3) -> seconds to wait, capped; None if bad.

    A receiver's header is input like any other: ``NaN``, ``inf``, negative numbers, 300-digit numbers and dates
    out of range are "no usable value" (None: the caller backs off on its own), never a NaN or an overflow that
    reaches the outbox (a NaN retry time failed every state write and retried at once). A date in the past is 0.
    """
    if value is None:
        return None
    value = value.strip()
    if not value or not value.isascii():
        return None
    if value.isdigit():  # the RFC's form: 1*DIGIT, any length (capped); never converted whole
        return MAX_RETRY_AFTER_SECONDS if len(value) > 9 else min(float(int(value)), MAX_RETRY_AFTER_SECONDS)
    if len(value) > MAX_RETRY_AFTER_CHARS:
        return None
    if _DECIMAL.fullmatch(value):  # "1.5": not the RFC's, but what some servers send
        seconds = float(value)
    else:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


def retry_after_body(body: bytes) -> float | None:
    """Discord's 429 body ``{"retry_after": <float seconds>, ...}`` (discord-api-docs rate-limits.mdx)."""
    if not body.lstrip().startswith(b"{"):
        return None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # a hostile body nests 64 KiB of brackets
        return None
    value = data.get("retry_after") if isinstance(data, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        seconds = float(value) if isinstance(value, float) or value < 2**53 else MAX_RETRY_AFTER_SECONDS
        if math.isfinite(seconds):
            return min(seconds, MAX_RETRY_AFTER_SECONDS)
    return None


def backoff(attempt: int, initial: float, maximum: float, rng: random.Random | None = None) -> float:
    """Delay before retry number ``attempt`` (1-based): exponential, capped, with +-50 % jitter."""
    base = min(maximum, initial * BACKOFF_MULTIPLIER ** max(0, attempt - 1))
    r = (rng or random).uniform(1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER)
    return min(maximum, base * r)


class TokenBucket:
    """Per-endpoint rate limit: ``rate`` tokens per second, bursts up to ``burst``. Time comes from the caller."""

    def __init__(self, rate_per_second: float, burst: float, now: float) -> None:
        self.rate = rate_per_second
        self.burst = max(1.0, burst)
        self.tokens = self.burst
        self.stamp = now

    def wait_time(self, now: float) -> float:
        """Seconds until a token is available (0 if one is available now)."""
        self._refill(now)
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate

    def take(self, now: float) -> None:
        """Spend one token (call after ``wait_time`` returned 0)."""
        self._refill(now)
        self.tokens -= 1.0

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
