"""The silence link of chat messages: ``GET /silences/new?alertname=...&uuid=...`` and its form's ``POST``.

With ``notify.external_url`` set, each firing alert in a chat message ends with a link here (format.silence_link)
instead of "POST /api/v1/silences with ...". A GET never changes anything: it shows the alert's matchers and a form
(duration, author, comment; the write token when ``notify.api.write_token`` is set). The POST creates the silence
through the same checks as the API (matchers, limits, loopback-only by default) and refuses a cross-site form:
the Host, Origin and Sec-Fetch-Site checks of every write (``cross_site.py``: a DNS-rebinding page names its own
host) and a CSRF token that only the form page carries, so a page elsewhere cannot silence alerts through the
user's browser. The page itself is served only to a Host that names this daemon (it carries the token).
Plain HTML, no script and no inline style: it works under any Content-Security-Policy the daemon sends.
"""

from __future__ import annotations

import hmac
import html
import shlex
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from gpuwatchd.notify.cross_site import FormTokens, cross_site_reason, host_allowed
from gpuwatchd.notify.format import SILENCE_FORM_PATH, SILENCE_KEYS
from gpuwatchd.notify.matchers import Matcher
from gpuwatchd.notify.peer import is_loopback
from gpuwatchd.notify.silence_input import SilenceError, make_matcher, parse_time
from gpuwatchd.notify.webhook import rfc3339

if TYPE_CHECKING:
    from gpuwatchd.notify.dispatcher import Dispatcher

DURATIONS = (("1h", 3600.0), ("2h", 7200.0), ("4h", 14400.0), ("1d", 86400.0), ("7d", 7 * 86400.0))
_MAX_FORM_BYTES = 16 * 1024


def _page(title: str, body: str, status: int = 200) -> web.Response:
    text = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)} - gpuwatchd</title></head><body>"
        f"<h1>{html.escape(title)}</h1>{body}</body></html>"
    )
    resp = web.Response(text=text, content_type="text/html", charset="utf-8", status=status)
    resp.headers["Cache-Control"] = "no-store"
    resp.headers.setdefault("Content-Security-Policy", "default-src 'none'; form-action 'self'")
    return resp


def _labels(query: Mapping[str, str]) -> list[tuple[str, str]]:
    return [(k, str(query[k])) for k in SILENCE_KEYS if query.get(k)]


# The hidden field of the form that carries its CSRF token.
TOKEN_FIELD = "csrf_token"  # noqa: S105 - a field name, not a secret
_FOREIGN_HOST = ("<p>This page is served only under this daemon's own address (a loopback name, its listen address"
                 " or notify.external_url).</p>")


def form_routes(d: Dispatcher) -> list[web.RouteDef]:
    """The two routes of the silence form."""
    tokens = FormTokens()

    async def show(request: web.Request) -> web.Response:
        if not host_allowed(request, d.config.external_url):
            return _page("Refused", _FOREIGN_HOST, 403)
        labels = _labels(request.query)
        if not labels:
            return _page("Silence", "<p>No alert labels given: open this page from a chat message's link.</p>", 400)
        rows = "".join(f"<li><code>{html.escape(k)}=&quot;{html.escape(v)}&quot;</code></li>" for k, v in labels)
        hidden = "".join(
            f'<input type=hidden name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in labels
        )
        options = "".join(
            f'<option value="{n}"{" selected" if n == "2h" else ""}>{n}</option>' for n, _ in DURATIONS
        )
        token = (
            "<p><label>Write token (notify.api.write_token) <input type=password name=token required></label></p>"
            if d.config.api.write_token is not None else ""
        )
        # Quoted for a shell: the labels come from the link's query, and a value holding $(...) or a backquote
        # would run when the reader pastes the command.
        shell = html.escape(" ".join(shlex.quote(str(Matcher(k, "=", v))) for k, v in labels))
        duration = f"<p><label>For <select name=duration>{options}</select></label></p>"
        body = (
            f"<p>Silence the alerts matching all of:</p><ul>{rows}</ul>"
            f'<form method=post action="{SILENCE_FORM_PATH}">{hidden}'
            f'<input type=hidden name={TOKEN_FIELD} value="{tokens.issue()}">'
            f"{duration}"
            "<p><label>Author <input name=author required maxlength=200></label></p>"
            "<p><label>Comment <input name=comment maxlength=2000></label></p>"
            f"{token}<p><button type=submit>Silence</button></p></form>"
            f"<p>Or from a shell on this host: <code>gpuwatchd silence add {shell} --for 2h --comment ...</code></p>"
        )
        return _page("Silence", body)

    async def create(request: web.Request) -> web.Response:
        api = d.config.api
        crossed = cross_site_reason(request, d.config.external_url)
        if crossed is not None:
            return _page("Refused", f"<p>This form can only be sent from the daemon's own page ({crossed[0]}:"
                         f" {html.escape(crossed[1])}).</p>", 403)
        if api.write_from_loopback_only and not is_loopback(request.remote):
            return _page("Refused", "<p>Silences can be changed from this host only "
                         "(notify.api.write_from_loopback_only); use <code>gpuwatchd silence add</code> there.</p>",
                         403)
        if request.content_length is not None and request.content_length > _MAX_FORM_BYTES:
            return _page("Refused", "<p>Form too large.</p>", 413)
        form = await request.post()
        stale = tokens.check(str(form.get(TOKEN_FIELD, "")))
        if stale is not None:
            return _page("Refused", f"<p>{html.escape(stale)}.</p>", 403)
        if api.write_token is not None:
            given = str(form.get("token", "")).encode()
            if not hmac.compare_digest(given, api.write_token.get_secret_value().encode()):
                return _page("Refused", "<p>Wrong write token.</p>", 401)
        labels = _labels({k: str(v) for k, v in form.items() if isinstance(v, str)})
        seconds = dict(DURATIONS).get(str(form.get("duration", "")))
        author = str(form.get("author", "")).strip()
        comment = str(form.get("comment", "")).strip()
        now = d.now()
        try:
            if not labels:
                raise SilenceError("matchers", "no matchers")
            if seconds is None:
                raise SilenceError("duration", f"duration: one of {', '.join(n for n, _ in DURATIONS)}")
            if not author:
                raise SilenceError("createdBy", "author: required")
            matchers = tuple(make_matcher(k, "=", v) for k, v in labels)
            parse_time(rfc3339(now + seconds), "endsAt")
            s = d.silences.add(
                matchers, starts_at=now, ends_at=now + seconds, created_by=author[:200], comment=comment[:2000],
                now=now, max_live=api.max_silences, max_duration=api.max_silence_duration,
            )
        except (SilenceError, ValueError) as e:
            return _page("Refused", f"<p>{html.escape(str(e))}</p>", getattr(e, "status", 400))
        d.wake()
        until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(now + seconds))
        return _page("Silenced", f"<p>Silenced until {until} (id <code>{s.id}</code>). End it early with "
                     f"<code>gpuwatchd silence expire {s.id}</code>.</p>")

    return [web.get(SILENCE_FORM_PATH, show), web.post(SILENCE_FORM_PATH, create)]
