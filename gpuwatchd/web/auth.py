"""HTTP basic auth for every endpoint, against the bcrypt hashes of the web config file (``webconfig.py``).

bcrypt is slow on purpose (~50-250 ms a check at cost 10): checks run in a small thread pool, never on the event
loop, so a scrape with a wrong password cannot stall the others. A successful check is remembered, keyed by a
SHA-256 of user, password and hash (never the password itself), so Prometheus' scrape every few seconds costs one
dictionary lookup; the memory is bounded (``CACHE_SIZE``, oldest dropped first), and that lookup never waits
behind uncached checks. Failures are not remembered: each costs a full check, as in exporter-toolkit, and at most
``CHECK_THREADS`` run at once.

Under a password flood the checks must not pile up: at most ``MAX_WAITING`` wait for a thread (first come, first
served), a request beyond that gets ``503`` with ``Retry-After`` at once, and a check whose client has gone by the
time a thread is free is dropped instead of run. So a correct login waits for at most ``MAX_WAITING`` checks,
whatever the flood (200 wrong passwords a second used to queue 20 s of work in front of it).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuwatchd.exporter.families import Families, spec

CACHE_SIZE = 256
CHECK_THREADS = 2
# Checks waiting for a thread; at cost 10 (~0.1 s a check, 2 threads) the queue drains in under 2 s.
MAX_WAITING = 32
RETRY_AFTER_SECONDS = 1
RESULTS = ("ok", "cached", "wrong", "refused", "dropped")
REALM = 'Basic realm="gpuwatchd", charset="UTF-8"'


def parse_basic(header: str) -> tuple[str, str] | None:
    """(user, password) from an ``Authorization: Basic ...`` value; None when it is not one."""
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


class BasicAuth:
    """Verifies credentials against ``users`` (user -> bcrypt hash)."""

    def __init__(self, users: Mapping[str, str]) -> None:
        # Imported and hashed here, only when auth is configured: a daemon without it neither loads bcrypt nor
        # spends the ~0.1 s of CPU a cost-10 hash takes at every start.
        import bcrypt

        self._bcrypt = bcrypt
        # Checked against when the user is unknown, so an unknown user costs the same time as a wrong password.
        self._dummy_hash = bcrypt.hashpw(b"gpuwatchd-no-such-user", bcrypt.gensalt(rounds=10))
        self._users = {u: h.encode() for u, h in users.items()}
        self._ok: OrderedDict[bytes, None] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=CHECK_THREADS, thread_name_prefix="bcrypt")
        self._slots: asyncio.Semaphore | None = None  # made on the loop; FIFO, so waiting is first come first served
        self._waiting = 0
        self.checks = 0  # bcrypt verifications actually run (tests)
        self.results: dict[str, int] = dict.fromkeys(RESULTS, 0)

    def _key(self, user: str, password: str, hashed: bytes) -> bytes:
        return hashlib.sha256(b"\0".join([user.encode(), password.encode(), hashed])).digest()

    def _check(self, password: str, hashed: bytes) -> bool:
        self.checks += 1
        try:
            return bool(self._bcrypt.checkpw(password.encode(), hashed))
        except ValueError:  # bcrypt refuses passwords over 72 bytes in newer versions
            return False

    async def verify(self, user: str, password: str, gone: Callable[[], bool] = lambda: False) -> bool | None:
        """True for valid credentials, False for invalid ones; None when the check was not run: too many waiting
        (``results["refused"]``) or the client left while it waited (``results["dropped"]``)."""
        hashed = self._users.get(user)
        key = self._key(user, password, hashed) if hashed is not None else None
        if key is not None and key in self._ok:  # the fast path: no queue, no thread
            self._ok.move_to_end(key)
            self.results["cached"] += 1
            return True
        if self._waiting >= MAX_WAITING:
            self.results["refused"] += 1
            return None
        if self._slots is None:
            self._slots = asyncio.Semaphore(CHECK_THREADS)
        self._waiting += 1
        try:
            async with self._slots:
                if gone():
                    self.results["dropped"] += 1
                    return None
                loop = asyncio.get_running_loop()
                # An unknown user costs the same check as a wrong password.
                ok = await loop.run_in_executor(self._pool, self._check, password, hashed or self._dummy_hash)
                ok = ok and hashed is not None
        finally:
            self._waiting -= 1
        self.results["ok" if ok else "wrong"] += 1
        if ok and key is not None:
            self._ok[key] = None
            if len(self._ok) > CACHE_SIZE:
                self._ok.popitem(last=False)
        return ok

    def middleware(self) -> Middleware:
        @web.middleware
        async def basic_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
            creds = parse_basic(request.headers.get(hdrs.AUTHORIZATION, ""))
            if creds is None:
                return _unauthorized()

            def gone() -> bool:
                transport = request.transport
                return transport is None or transport.is_closing()

            ok = await self.verify(*creds, gone=gone)
            if ok is None:
                return web.Response(status=503, text="Too many password checks waiting; retry\n",
                                    headers={hdrs.RETRY_AFTER: str(RETRY_AFTER_SECONDS)})
            if not ok:
                return _unauthorized()
            return await handler(request)

        return basic_auth

    def collector(self) -> Collector:
        return _AuthCollector(self)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)



def _unauthorized() -> web.Response:
    return web.Response(status=401, text="Unauthorized\n", headers={hdrs.WWW_AUTHENTICATE: REALM})


AUTH_CHECKS = spec(
    "gpuwatchd_http_auth_checks_total",
    "counter",
    "Basic-auth credential checks by result: ok and wrong (a bcrypt check ran), cached (a credential that passed"
    " before: a lookup, no bcrypt), refused (too many checks waiting: 503 with Retry-After), dropped (the client"
    " left before a thread was free: not run). Present when the web config has basic_auth_users.",
    labels=["result"],
)
AUTH_SPECS = (AUTH_CHECKS,)


class _AuthCollector(Collector):
    def __init__(self, auth: BasicAuth) -> None:
        self._auth = auth

    def collect(self) -> Iterator[Metric]:
        fams = Families()
        for result, n in self._auth.results.items():
            fams.add(AUTH_CHECKS, (result,), n)
        yield from fams.metrics()
