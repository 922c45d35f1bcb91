"""Delivery workers: one per receiver, draining its outbox rows strictly in order.

Each attempt: wait for ``next_attempt`` and a rate-limit token, POST, classify (``retry.classify_status``), then
mark the row delivered (with the notification log, atomically), schedule a retry, or give up. A row older than
``max_retry_age`` is given up. The head row blocks the ones behind it, so a receiver sees messages in order.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from gpuwatchd.notify.config import Member, NotifyConfig, ReceiverConfig
from gpuwatchd.notify.integrations import integration
from gpuwatchd.notify.metrics import NotifyMetrics
from gpuwatchd.notify.redaction import describe_error, redact, secret_fragments
from gpuwatchd.notify.retry import MAX_RETRY_AFTER_SECONDS, TokenBucket, Verdict, backoff, classify_status
from gpuwatchd.notify.store import Outbox, OutboxRow
from gpuwatchd.notify.store.database import MAX_PAYLOAD_BYTES
from gpuwatchd.runtime.clock import Clock
from gpuwatchd.runtime.http_body import read_capped
from gpuwatchd.runtime.waits import nap

log = logging.getLogger(__name__)

# Error bodies are logged for diagnosis, but short: a 5xx page can be megabytes of HTML.
ERROR_BODY_LOG_CHARS = 200
# Most of a receiver's answer read (Retry-After in a 429 body, the error text); the rest is left unread.
MAX_RESPONSE_BYTES = 64 * 1024
IDEMPOTENCY_HEADER = "Idempotency-Key"
USER_AGENT = "gpuwatchd"
# How long a worker waits to page in its queue while the state database holds writes in memory (disk full).
REFILL_RETRY_SECONDS = 5.0
# Keep the notification log entry for two repeat intervals, like Alertmanager (notify/set_notifies_stage.go).
LOG_RETENTION_FACTOR = 2


def receiver_secrets(rc: ReceiverConfig) -> list[str]:
    """Every secret string of one receiver (URL, HMAC key, header values)."""
    out = [rc.url.get_secret_value(), *(u.get_secret_value() for u in rc.urls)]
    if rc.hmac_secret is not None:
        out.append(rc.hmac_secret.get_secret_value())
    out.extend(v.get_secret_value() for v in rc.headers.values())
    return out


@dataclass(frozen=True, slots=True)
class Attempt:
    """One POST to a receiver: HTTP status (None when no answer), the verdict, the error as said, the latency."""

    status: int | None
    verdict: Verdict
    error: str | None
    seconds: float


def _snippet(body: bytes, secrets: list[str]) -> str:
    """The start of an error body for the log and the outbox, on one line, with every secret form redacted.

    Redacted before it is cut: a cut through a secret would leave a prefix no fragment matches.
    """
    text = redact(body.decode(errors="replace"), secrets)
    return " ".join(text.split())[:ERROR_BODY_LOG_CHARS]


async def post_once(
    session: aiohttp.ClientSession, rc: ReceiverConfig, payload: str, *, url: str, endpoint: str,
    idempotency_key: str, secrets: list[str], now: float,
) -> Attempt:  # fmt: skip
    """POST one outbox text to one receiver member as every delivery does (the integration's body, content type
    and headers, the receiver's headers, timeout, no redirects) and classify the answer; errors name the
    endpoint, never its URL. The delivery workers and ``gpuwatchd notify test`` both send through this."""
    # The integration owns its request (notify/integration.py): body, content type, its own headers, the URL.
    req = integration(rc.type).request(payload, rc, url)
    if len(req.body) > MAX_PAYLOAD_BYTES:  # never sent, whatever the outbox holds
        too_big = f"{endpoint}: not sent: {len(req.body)} bytes, over the {MAX_PAYLOAD_BYTES}-byte cap"
        return Attempt(None, Verdict("permanent", "too_large"), too_big, 0.0)
    headers = {
        "Content-Type": req.content_type,
        "User-Agent": USER_AGENT,
        IDEMPOTENCY_HEADER: idempotency_key,
    }
    headers.update({k: v.get_secret_value() for k, v in rc.headers.items()})
    headers.update(req.headers)
    t0 = time.monotonic()
    status: int | None = None
    answer: dict[str, str] = {}
    text = b""
    error: str | None = None
    verdict: Verdict | None = None
    try:
        async with session.post(
            req.url,
            data=req.body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=rc.timeout),
            allow_redirects=False,
        ) as resp:
            status, answer = resp.status, dict(resp.headers)
            if 200 <= status < 300:
                # Accepted: the notification is delivered, whatever becomes of the rest of the answer. A receiver
                # that dribbles its body (or reads ours slowly), or closes mid-body, used to turn a 200 into a
                # timeout or a payload error, and the same notification was sent again 14-21 times.
                _done_with(resp)
            else:
                text = await read_capped(resp.content, MAX_RESPONSE_BYTES)  # an answer can be any size
    except asyncio.TimeoutError:
        if status is None:
            error = f"{endpoint}: timed out after {rc.timeout:g}s"
            verdict = Verdict("retry", "timeout")
    except (aiohttp.ClientError, OSError, ValueError) as e:
        if status is None:
            # aiohttp puts the URL in many of these texts: redact before it reaches a log or the API.
            error = f"{endpoint}: {describe_error(e, secrets)}"
            verdict = Verdict("retry", "connection")
    if verdict is None:
        assert status is not None
        # The status decides, also when the error body broke off (its start is enough for Retry-After and the log).
        verdict = classify_status(status, answer, text, now)
        if verdict.outcome != "success":
            error = f"{endpoint}: HTTP {status}: {_snippet(text, secrets)}"
    return Attempt(status, verdict, error, time.monotonic() - t0)


def _done_with(resp: aiohttp.ClientResponse) -> None:
    """Let go of a 2xx answer without waiting for its body: the connection is kept for the next request only when
    the whole answer is already in (the usual short ``ok``), else closed (a receiver that holds it open cannot hold
    the worker, and our unsent request body, if any, is dropped with it)."""
    if resp.content.is_eof():
        resp.release()
    else:
        resp.close()


class Worker:
    """Delivers one receiver member's outbox (one URL; an Alertmanager cluster has a worker per member, each with
    its own rows, retries and backoff, so a member that is down delays nothing for the others)."""

    def __init__(
        self,
        rc: ReceiverConfig,
        config: NotifyConfig,
        *,
        outbox: Outbox,
        clock: Clock,
        metrics: NotifyMetrics,
        session: aiohttp.ClientSession,
        on_change: Callable[[OutboxRow, str], None],
        member: Member | None = None,
    ) -> None:
        self.rc = rc
        self.member = member if member is not None else rc.members[0]
        self.key = self.member.key  # outbox rows and metrics are kept under it
        self.endpoint = self.member.endpoint
        self.config = config
        self._outbox = outbox
        self._clock = clock
        self._metrics = metrics
        self._session = session
        self._on_change = on_change  # (row, new status) -> dispatcher bookkeeping
        self._secrets = secret_fragments(receiver_secrets(rc))
        per_second = rc.rate_limit_per_minute / 60.0
        # Burst: a handful of messages at once is fine for every service (Slack: "bursts allowed").
        self._bucket = TokenBucket(per_second, burst=min(5.0, rc.rate_limit_per_minute), now=clock.now())
        self._rng = random.Random()
        self.wake = asyncio.Event()
        self.stopping = False
        self.in_flight: int | None = None
        self.last_error: str | None = None

    def take_token(self, now: float) -> float:
        """Spend a token of this member's rate limit for a send outside the outbox (a receiver test); returns 0 when
        taken, else the seconds until one is free (nothing spent)."""
        wait = self._bucket.wait_time(now)
        if wait <= 0:
            self._bucket.take(now)
        return wait

    async def run(self) -> None:
        """Loop until cancelled or ``stopping``."""
        while not self.stopping:
            row = self._outbox.next_pending(self.key)
            now = self._clock.now()
            if row is None:
                if self._outbox.backlog(self.key) > 0:  # the next page of a long queue, from the file
                    if not await self._outbox.refill(self.key):
                        await nap(self._clock, now + REFILL_RETRY_SECONDS * self._clock.speed, self.wake)
                    continue
                await nap(self._clock, now + 3600, self.wake)
                continue
            if now - row.created > self.config.max_retry_age:
                self._give_up(row, "expired", f"not delivered within max_retry_age after {row.attempts} attempts")
                continue
            if row.next_attempt > now:
                await nap(self._clock, row.next_attempt, self.wake)
                continue
            if not self._outbox.settled():
                # The row is on disk before its first attempt, and the outcome of the previous one too: a kill
                # during this request re-sends this row only (the outbox writes on its own thread).
                await self._outbox.drain()
                head = self._outbox.next_pending(self.key)
                if head is None or head.id != row.id:
                    continue
                row = head
            wait = self._bucket.wait_time(now)
            if wait > 0:
                await nap(self._clock, now + wait, asyncio.Event())
                continue
            self._bucket.take(now)
            self.in_flight = row.id
            try:
                verdict = await self._attempt(row)
            finally:
                self.in_flight = None
            self._settle(row, verdict)

    async def _attempt(self, row: OutboxRow) -> Verdict:
        result = await post_once(
            self._session, self.rc, row.payload, url=self.member.url.get_secret_value(), endpoint=self.endpoint,
            idempotency_key=row.idempotency_key, secrets=self._secrets, now=self._clock.now(),
        )  # fmt: skip
        self._metrics.latency.labels(self.key, self.rc.type).observe(result.seconds)
        if result.verdict.outcome != "success":
            self.last_error = result.error
        return result.verdict

    def _settle(self, row: OutboxRow, verdict: Verdict) -> None:
        now = self._clock.now()
        if verdict.outcome == "success":
            # Pushes of alert state (Alertmanager) are not grouped notifications: nothing to log.
            log_it = integration(self.rc.type).grouped
            expires = now + LOG_RETENTION_FACTOR * self.config.repeat_interval
            self._outbox.mark_delivered(row, now, expires, log=log_it)
            self._metrics.outcome(self.key, self.rc.type, "success")
            self.last_error = None
            log.debug("%s: delivered notification %d (%s)", self.endpoint, row.id, row.group_key)
            self._on_change(row, "delivered")
            return
        if verdict.outcome == "permanent":
            self._give_up(row, verdict.reason, self.last_error or verdict.reason)
            return
        attempt = row.attempts + 1
        # Exponential backoff always; a server's Retry-After (parsed defensively: retry.py) only lengthens it. A 429
        # saying "0", "-1" or "NaN" used to be retried at once, 64 times a minute.
        delay = backoff(attempt, self.config.retry_initial, self.config.retry_max, self._rng)
        if verdict.delay is not None and math.isfinite(verdict.delay):
            delay = max(delay, min(verdict.delay, MAX_RETRY_AFTER_SECONDS))
        self._outbox.mark_retry(row.id, now + delay, self.last_error or verdict.reason)
        self._metrics.outcome(self.key, self.rc.type, "retry", verdict.reason)
        log.warning("%s (attempt %d, retry in %.1fs)", self.last_error or verdict.reason, attempt, delay)

    def _give_up(self, row: OutboxRow, reason: str, error: str) -> None:
        self._outbox.mark_failed(row.id, self._clock.now(), error)
        self._metrics.outcome(self.key, self.rc.type, "failure", reason)
        log.error("%s: notification %d dropped: %s", self.endpoint, row.id, error)
        self._on_change(row, "failed")
