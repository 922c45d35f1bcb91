"""``gpuwatchd silence add|list|expire``: the daemon's silences API (``/api/v1/silences``) from the shell.

Like ``amtool silence``: matchers as Alertmanager writes them (``uuid="GPU-..."``, ``alertname=~"GpuThrottled|..."``,
or ``name=value``), a relative duration (``--for 2h``), a comment and an author. It talks to a running daemon with
the same TLS trust and basic auth as ``status`` (runtime/daemon_client.py); a daemon with ``notify.api.write_token``
needs the token (``--token-file`` or ``$GPUWATCHD_WRITE_TOKEN``) to add or expire.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuwatchd.cli.arg_types import daemon_url, timeout_seconds
from gpuwatchd.runtime.daemon_client import ClientSetupError, DaemonClient, add_client_args, client_for, tls_problem
from gpuwatchd.runtime.exitcodes import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from gpuwatchd.runtime.json_answer import SILENCE_SHAPE, AnswerError, check_shape, not_gpuwatchd
from gpuwatchd.runtime.terminal import safe_tree, say

TOKEN_ENV = "GPUWATCHD_WRITE_TOKEN"  # noqa: S105  (the variable's name, not a token)
EXIT_REFUSED = 1  # the daemon answered with an error (bad matcher, too long, not allowed)


def add_parser(sub: Any) -> None:
    """The ``silence`` command and its three sub-commands."""
    p = sub.add_parser("silence", help="add, list or expire silences of a running daemon (its /api/v1/silences)")
    s = p.add_subparsers(dest="silence_command", metavar="SUBCOMMAND", required=True)
    add = s.add_parser("add", help="silence alerts matching all MATCHERs for a while")
    add.add_argument("matchers", nargs="+", metavar="MATCHER",
                     help='label matcher: name="value", name!="value", name=~"regex", name!~"regex" (or name=value)')
    add.add_argument("--for", dest="duration", default="2h", metavar="DURATION",
                     help="how long, from now: 30m, 2h, 1d (default 2h)")
    add.add_argument("--comment", "-c", default="", help="why (shown in the API and the status page)")
    add.add_argument("--author", "-a", default=None, help="who (default: USER@HOST)")
    lst = s.add_parser("list", help="the daemon's silences (pending and active; --all adds expired ones)")
    lst.add_argument("--all", action="store_true", help="also list expired silences")
    lst.add_argument("--json", action="store_true", help="print the API's JSON")
    exp = s.add_parser("expire", help="end silences now")
    exp.add_argument("ids", nargs="+", metavar="ID")
    for q in (add, lst, exp):
        q.add_argument("--url", type=daemon_url, help="daemon base URL (default: from the config's listen address)")
        q.add_argument("--config", type=Path, help="config file to read listen and web_config_file from")
        q.add_argument("--timeout", type=timeout_seconds, default=5.0,
                       help="seconds to wait for each answer of the daemon (default 5)")
        q.add_argument("--token-file", type=Path, metavar="FILE",
                       help=f"file holding notify.api.write_token (default: ${TOKEN_ENV})")
        add_client_args(q)


def _duration(text: str) -> float:
    from gpuwatchd.config.types import parse_duration

    seconds = parse_duration(text)
    if seconds <= 0:
        raise ValueError("must be > 0")
    return seconds


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


MAX_TOKEN_FILE_BYTES = 64 << 10  # a token is a line; as the --auth-password-file limit


def _token(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    if args.token_file is not None:
        from gpuwatchd.config.files import InputFileError, read_text_file, shown_path

        try:  # the capped, non-blocking reader of every user-named file: a FIFO or /dev/zero here hung the command
            lines = read_text_file(args.token_file, max_bytes=MAX_TOKEN_FILE_BYTES).splitlines()
        except InputFileError as e:
            raise ClientSetupError(f"--token-file {shown_path(args.token_file)}: {e}") from None
        if not lines or not lines[0].strip():
            raise ClientSetupError(f"--token-file {shown_path(args.token_file)}: cannot read a token (empty file)")
        return lines[0].strip()
    return env.get(TOKEN_ENV) or None


def _err(msg: str) -> None:
    say(f"gpuwatchd silence: {msg}", sys.stderr)


# What of a non-JSON error answer (an HTML page, a proxy's text) is shown.
SHOWN_ERROR_CHARS = 200


async def _call(method: str, url: str, client: DaemonClient, *, token: str | None, timeout: float,
                body: Any = None) -> tuple[int, Any]:
    """The answer's HTTP status and JSON document (runtime/json_answer.py: capped in size, depth and values). A
    200 that is not JSON raises :class:`AnswerError`; an error answer that is not JSON is its first characters."""
    import aiohttp

    from gpuwatchd.runtime.json_answer import read_answer

    kw = client.session_args()
    headers = dict(kw.pop("headers", {}))
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"  # the API's write guard; basic auth is the exporter's
        if client.user is not None:
            raise ClientSetupError("--auth-user and a write token cannot both be sent (one Authorization header)")
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout), headers=headers, **kw) as s,
        s.request(method, url, json=body) as r,
    ):
        raw = await r.content.read(SHOWN_ERROR_CHARS) if r.status != 200 and not _json_type(r) else None
        if raw is not None:
            return r.status, raw.decode("utf-8", "replace").strip() or None
        try:
            return r.status, await read_answer(r.content)
        except AnswerError:
            if r.status == 200:
                raise
            return r.status, None


def _json_type(r: Any) -> bool:
    return "json" in (r.content_type or "")


def _age(ts_text: str, now: float) -> str:
    try:
        ts = datetime.fromisoformat(ts_text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return ts_text
    left = ts - now
    if left <= 0:
        return "ended"
    h, rem = divmod(int(left), 3600)
    return f"{h}h{rem // 60:02d}m left" if h else f"{rem // 60}m{rem % 60:02d}s left"


def _matchers_text(ms: list[dict[str, Any]]) -> str:
    out = []
    for m in ms:
        eq = m.get("isEqual", True)
        op = ("=~" if eq else "!~") if m.get("isRegex") else ("=" if eq else "!=")
        out.append(f'{m.get("name")}{op}"{m.get("value")}"')
    return ", ".join(out)


def render_list(silences: list[dict[str, Any]], now: float, *, show_all: bool) -> str:
    """One line per silence: id, state, time left, matchers, author and comment (terminal-safe: any local user
    can write a comment holding escape sequences)."""
    silences = safe_tree(silences, 2000)
    rows = [s for s in silences if show_all or s.get("status", {}).get("state") != "expired"]
    if not rows:
        return "no silences" + ("" if show_all else " (pending or active; --all lists expired ones too)")
    lines = []
    for s in rows:
        state = s.get("status", {}).get("state", "?")
        left = _age(str(s.get("endsAt", "")), now) if state != "expired" else "expired"
        who = s.get("createdBy", "")
        comment = f" — {s['comment']}" if s.get("comment") else ""
        what = _matchers_text(s.get("matchers", []))
        lines.append(f"{s.get('id')}  {state:<7}  {left:<12}  {what}  by {who}{comment}")
    return "\n".join(lines)


def cmd_silence(args: argparse.Namespace, default_url: str, env: Mapping[str, str] = os.environ) -> int:
    """Run ``silence add|list|expire``; exit 0 done, 1 refused by the daemon, 2 usage, 3 daemon unreachable."""
    import asyncio  # here, not at the top: building the parser (``gpuwatchd --help``) must not load asyncio

    try:
        client = client_for(args, args.config)
        token = _token(args, env)
    except ClientSetupError as e:
        _err(str(e))
        return EXIT_USAGE
    base = (args.url or default_url).rstrip("/") + "/api/v1/silences"
    try:
        return asyncio.run(_run(args, base, client, token))
    except ClientSetupError as e:
        _err(str(e))
        return EXIT_USAGE
    except AnswerError as e:
        _err(not_gpuwatchd(base, "silences API", str(e)))
        return EXIT_UNREACHABLE
    except Exception as e:  # aiohttp.ClientError, OSError, TimeoutError: the daemon is not reachable
        import aiohttp

        if not isinstance(e, aiohttp.ClientError | OSError | asyncio.TimeoutError):
            raise
        why = tls_problem(base, e) or f"{type(e).__name__}: {e}".rstrip(": ")
        _err(f"no daemon reachable at {base}: {why}")
        return EXIT_UNREACHABLE


async def _run(args: argparse.Namespace, base: str, client: DaemonClient, token: str | None) -> int:
    now = time.time()
    if args.silence_command == "list":
        status, data = await _call("GET", base, client, token=None, timeout=args.timeout)
        if status != 200:
            _err(f"GET {base}: HTTP {status}: {_error_text(data)}")
            return EXIT_REFUSED
        if not isinstance(data, list):
            raise AnswerError("not a list of silences")
        for i, item in enumerate(data):
            problem = check_shape(item, SILENCE_SHAPE, f"[{i}]")
            if problem is not None:
                raise AnswerError(problem)
        # --json: json.dumps escapes every control character (ASCII output), so it is terminal-safe as is.
        say(json.dumps(data, indent=2) if args.json else render_list(data, now, show_all=args.all))
        return EXIT_OK
    if args.silence_command == "add":
        try:
            seconds = _duration(args.duration)
        except ValueError as e:
            _err(f"--for {args.duration!r}: {e}")
            return EXIT_USAGE
        import getpass
        import socket

        author = args.author or f"{getpass.getuser()}@{socket.gethostname()}"
        body = {"matchers": [_normalize(m) for m in args.matchers], "startsAt": _rfc3339(now),
                "endsAt": _rfc3339(now + seconds), "createdBy": author, "comment": args.comment}
        status, data = await _call("POST", base, client, token=token, timeout=args.timeout, body=body)
        if status != 200:
            _err(f"refused (HTTP {status}): {_error_text(data)}")
            return EXIT_REFUSED
        sid = data.get("silenceID") if isinstance(data, dict) else None
        if not isinstance(sid, str) or not sid:
            raise AnswerError("no silenceID in the answer")
        say(sid)
        say(f"silenced until {_rfc3339(now + seconds)}: {', '.join(body['matchers'])}", sys.stderr)
        return EXIT_OK
    failed = False
    from urllib.parse import quote

    for sid in args.ids:
        status, data = await _call("DELETE", f"{base}/{quote(sid, safe='')}", client, token=token,
                                   timeout=args.timeout)
        if status == 200:
            say(f"{sid} expired")
        else:
            _err(f"{sid}: refused (HTTP {status}): {_error_text(data)}")
            failed = True
    return EXIT_REFUSED if failed else EXIT_OK


def _normalize(matcher: str) -> str:
    """``name=value`` (unquoted, as amtool accepts) becomes ``name="value"``, quoted the way the daemon unquotes
    (notify/matchers.py: non-ASCII and tabs as they are, ``\\`` and ``"`` escaped); quoted matchers pass as written.
    """
    from gpuwatchd.notify.matchers import quote

    for op in ("=~", "!~", "!=", "="):
        name, sep, value = matcher.partition(op)
        if sep and name and not name.endswith(("!", "=")):
            v = value.strip(" ")
            if not (len(v) >= 2 and v[0] == v[-1] == '"'):
                v = quote(v)
            return f"{name.strip()}{op}{v}"
    return matcher


def _error_text(data: Any) -> str:
    if isinstance(data, dict) and "error" in data:
        return str(data["error"])
    return str(data)
