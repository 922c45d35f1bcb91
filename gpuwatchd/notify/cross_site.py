"""Refusing cross-site and DNS-rebinding requests to the endpoints that change state (silences, probes, receiver
tests), and the CSRF token of the silence form.

A browser on this host is a loopback peer, so "loopback only" does not stop a page from another origin: a plain
form POST needs no CORS preflight, and a DNS-rebinding page (its name re-resolved to 127.0.0.1) is even same-origin
in the browser's eyes. So every state-changing request, with or without auth configured, must pass:

- **Host** names this daemon: a loopback name or address (``localhost``, 127.0.0.0/8, ``::1``), the configured
  listen host, the address the connection arrived on (``[::]`` and ``0.0.0.0`` accept any of this host's
  addresses), this host's name, or the host of ``notify.external_url``. A rebinding page always sends its own
  name (``evil.example``).
- **Origin**, when a browser sends one (it does on every cross-origin POST and DELETE), is this daemon's own origin
  (scheme, host and port of the request) or that of ``notify.external_url``; ``null`` (a sandboxed frame, a
  ``data:`` page) is refused.
- **Sec-Fetch-Site**, when sent, is ``same-origin`` or ``none`` (typed in the address bar); ``same-site`` (another
  port of the same host) and ``cross-site`` are refused.

Command-line clients (``gpuwatchd silence``, ``curl``) send no Origin and a Host naming the address they dialled,
so they pass. The JSON API also wants ``Content-Type: application/json`` on its bodies (``api.py``), which a
browser cannot send cross-origin without a preflight the daemon never grants; the form has a token instead
(:class:`FormTokens`), handed out only in the form page, which another origin cannot read.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import secrets
import socket
import time
from urllib.parse import urlsplit

from aiohttp import web

# The daemon's ``listen`` host as configured (set on the app by the daemon's HTTP wiring): a name there is what
# `gpuwatchd silence` dials by default (runtime/daemon_client.py), so it is one of the daemon's own names.
LISTEN_HOST: web.AppKey[str] = web.AppKey("gpuwatchd_listen_host", str)
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
# A silence form token is good for this long after the page was served: time to read the alert and fill the form.
FORM_TOKEN_SECONDS = 3600.0
# Fetch Metadata values a state change may come with: the daemon's own page, or no page at all (typed URL).
ALLOWED_FETCH_SITES = frozenset({"same-origin", "none"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


@functools.cache
def _own_names() -> frozenset[str]:
    """This host's name (what ``gpuwatchd silence --url http://$(hostname):9945`` sends); looked up once."""
    name = socket.gethostname().lower().rstrip(".")
    return frozenset({name, name.split(".")[0]}) if name else frozenset()


def _hostname(authority: str) -> tuple[str, int | None] | None:
    """(lower-case host without brackets or trailing dot, port) of a Host value; None when it is not one."""
    if not authority or any(c.isspace() or c in "/?#@\\" for c in authority):
        return None
    try:
        parts = urlsplit(f"//{authority}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host:
        return None
    return host.rstrip("."), port


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _local_address(request: web.BaseRequest) -> str | None:
    transport = request.transport
    sock = transport.get_extra_info("sockname") if transport is not None else None
    return str(sock[0]) if isinstance(sock, tuple) and sock else None


def _origin_of(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an absolute http(s) URL, the port made explicit; None otherwise."""
    try:
        parts = urlsplit(url.strip())
        scheme, host, port = parts.scheme.lower(), parts.hostname, parts.port
    except ValueError:
        return None
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    return scheme, host.rstrip("."), port if port is not None else _DEFAULT_PORTS[scheme]


def host_allowed(request: web.BaseRequest, external_url: str = "") -> bool:
    """Whether the request's Host header names this daemon (see the module docstring). No Host at all (HTTP/1.0,
    never a browser) passes."""
    raw = request.headers.getall("Host", [])
    if not raw:
        return True
    if len(raw) > 1:
        return False
    parsed = _hostname(raw[0].strip())
    if parsed is None:
        return False
    host, _ = parsed
    if host in LOOPBACK_NAMES or host in _own_names():
        return True
    listen = request.app.get(LISTEN_HOST) if isinstance(request, web.Request) else None
    if listen and host == listen.strip("[]").lower().rstrip("."):
        return True
    ip = _ip(host)
    if ip is not None:
        if ip.is_loopback:
            return True
        local = _local_address(request)
        local_ip = _ip(local) if local else None
        return local_ip is not None and local_ip == ip
    ext = _origin_of(external_url) if external_url else None
    return ext is not None and ext[1] == host


def cross_site_reason(request: web.BaseRequest, external_url: str = "") -> tuple[str, str] | None:
    """(header at fault, why) if ``request`` may not change state from where it comes, else None."""
    if not host_allowed(request, external_url):
        return "Host", ("Host names neither this daemon's address, a loopback name nor notify.external_url"
                        " (a DNS-rebinding page sends its own name)")
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site.strip().lower() not in ALLOWED_FETCH_SITES:
        return "Sec-Fetch-Site", f"sent by a page of another site ({site.strip()[:40]!r}), not the daemon's own"
    origins = request.headers.getall("Origin", [])
    if not origins:
        return None  # not a browser: the CLI, curl, a script
    if len(origins) > 1:
        return "Origin", "more than one Origin header"
    origin = _origin_of(origins[0])
    if origin is None:
        return "Origin", "sent by an opaque origin (null: a sandboxed frame or a data: page)"
    scheme = "https" if request.secure else "http"
    host = _hostname(request.headers.get("Host", "").strip())
    own = (scheme, host[0], host[1] if host[1] is not None else _DEFAULT_PORTS[scheme]) if host else None
    if origin == own or (external_url and origin == _origin_of(external_url)):
        return None
    return "Origin", "sent by a page of another origin than this daemon's"


class FormTokens:
    """CSRF tokens for the silence form: ``<expiry>.<HMAC of it>`` under a key made at start (so a restart makes
    old pages ask for a reload). Handed out only in the form page, which another origin cannot read."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)

    def _mac(self, expiry: str) -> str:
        return hmac.new(self._key, f"silence-form:{expiry}".encode(), hashlib.sha256).hexdigest()

    def issue(self, now: float | None = None) -> str:
        expiry = str(int((time.time() if now is None else now) + FORM_TOKEN_SECONDS))
        return f"{expiry}.{self._mac(expiry)}"

    def check(self, token: str, now: float | None = None) -> str | None:
        """None for a valid token, else why it is not (for the page)."""
        expiry, sep, mac = token.partition(".")
        if not sep or not expiry.isascii() or not expiry.isdigit() or len(expiry) > 12:
            return "the form has no valid token: open it again from the alert's link"
        if not hmac.compare_digest(mac.encode(), self._mac(expiry).encode()):
            return "the form's token is not this daemon's (it restarted, or the form came from elsewhere): reload it"
        if int(expiry) < (time.time() if now is None else now):
            return "the form is older than an hour: reload it"
        return None


def json_content_type(request: web.BaseRequest) -> bool:
    """Whether a write's body is declared JSON: the one body type a browser cannot send cross-origin without a CORS
    preflight (forms send ``x-www-form-urlencoded``, ``multipart`` or ``text/plain``; a bare body sends none)."""
    return request.content_type.lower() == "application/json"


JSON_CONTENT_TYPE_ERROR = "body: Content-Type must be application/json (curl: -H 'Content-Type: application/json')"
