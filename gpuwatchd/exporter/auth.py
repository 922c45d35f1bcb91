"""HTTP basic auth for every endpoint, against the bcrypt hashes of the web config file (``webconfig.py``).

bcrypt is slow on purpose (~50-250 ms a check at cost 10): checks run in a small thread pool, never on the event
loop, so a scrape with a wrong password cannot stall the others. A successful check is remembered, keyed by a
SHA-256 of user, password and hash (never the password itself), so Prometheus' scrape every few seconds costs one
dictionary lookup; the memory is bounded (``CACHE_SIZE``, oldest dropped first). Failures are not remembered: each
costs a full check, as in exporter-toolkit, and at most ``CHECK_THREADS`` run at once.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

CACHE_SIZE = 256
CHECK_THREADS = 2
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
        self.checks = 0  # bcrypt verifications actually run (tests)

    def _key(self, user: str, password: str, hashed: bytes) -> bytes:
        return hashlib.sha256(b"\0".join([user.encode(), password.encode(), hashed])).digest()

    def _check(self, password: str, hashed: bytes) -> bool:
        self.checks += 1
        try:
            return bool(self._bcrypt.checkpw(password.encode(), hashed))
        except ValueError:  # bcrypt refuses passwords over 72 bytes in newer versions
            return False

    async def verify(self, user: str, password: str) -> bool:
        hashed = self._users.get(user)
        if hashed is None:
            await asyncio.get_running_loop().run_in_executor(self._pool, self._check, password, self._dummy_hash)
            return False
        key = self._key(user, password, hashed)
        if key in self._ok:
            self._ok.move_to_end(key)
            return True
        ok = await asyncio.get_running_loop().run_in_executor(self._pool, self._check, password, hashed)
        if ok:
            self._ok[key] = None
            if len(self._ok) > CACHE_SIZE:
                self._ok.popitem(last=False)
        return ok

    def middleware(self) -> Middleware:
        @web.middleware
        async def basic_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
            creds = parse_basic(request.headers.get(hdrs.AUTHORIZATION, ""))
            if creds is None or not await self.verify(*creds):
                return web.Response(status=401, text="Unauthorized\n", headers={hdrs.WWW_AUTHENTICATE: REALM})
            return await handler(request)

        return basic_auth

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

