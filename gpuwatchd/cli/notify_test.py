"""``gpuwatchd notify test [--config FILE] [--receiver NAME]``: send a test notification to each receiver.

The message goes through the real delivery path: the receiver's own renderer (Slack, Discord, Teams, Mattermost,
webhook, Alertmanager) and :func:`gpuwatchd.notify.delivery.post_once`, the POST every notification makes (headers,
HMAC signature, timeout, no redirects, the same success/retry/permanent classification). One line per receiver
with the HTTP status and latency, or the error as the service sent it; exit 1 when any receiver failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpuwatchd.cli.arg_types import daemon_url, timeout_seconds
from gpuwatchd.runtime.daemon_client import add_client_args
from gpuwatchd.runtime.exitcodes import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from gpuwatchd.runtime.terminal import say

EXIT_FAILED = 1


def add_parser(sub: Any) -> None:
    """The ``notify`` command with its ``test`` sub-command."""
    p = sub.add_parser("notify", help="notification tools: `notify test` sends a test message to each receiver")
    s = p.add_subparsers(dest="notify_command", metavar="SUBCOMMAND", required=True)
    t = s.add_parser("test", help="send a test notification through each receiver of a config and print the result")
    t.add_argument("--config", type=Path,
                   help="config file with notify.receivers (default: /etc/gpuwatchd/gpuwatchd.yml)")
    t.add_argument("--receiver", action="append", metavar="NAME", help="only this receiver (repeatable)")
    t.add_argument("--url", type=daemon_url,
                   help="test the receivers of the daemon running at this URL (POST /api/v1/receivers/test; "
                   "from its host, or with --token-file) instead of a config file's")
    t.add_argument("--token-file", type=Path, metavar="FILE",
                   help="file holding the daemon's notify.api.write_token (default: $GPUWATCHD_WRITE_TOKEN)")
    t.add_argument("--timeout", type=timeout_seconds, default=60.0,
                   help="seconds to wait for the daemon's answer (default 60)")
    add_client_args(t)


def _via_daemon(args: argparse.Namespace) -> int:
    """``notify test --url``: the running daemon sends the test messages with its own receivers and reports back."""
    import asyncio
    import os
    from urllib.parse import urlencode

    from gpuwatchd.cli.silence import _call, _token
    from gpuwatchd.runtime.daemon_client import ClientSetupError, client_for
    from gpuwatchd.runtime.json_answer import AnswerError, not_gpuwatchd

    try:
        client = client_for(args, args.config)
        token = _token(args, os.environ)
    except ClientSetupError as e:
        say(f"gpuwatchd notify: {e}", sys.stderr)
        return EXIT_USAGE
    query = f"?{urlencode([('receiver', n) for n in args.receiver])}" if args.receiver else ""
    url = f"{args.url.rstrip('/')}/api/v1/receivers/test{query}"
    try:
        status, data = asyncio.run(_call("POST", url, client, token=token, timeout=args.timeout))
    except AnswerError as e:
        say(f"gpuwatchd notify: {not_gpuwatchd(args.url, 'receiver test answer', str(e))}", sys.stderr)
        return EXIT_UNREACHABLE
    except Exception as e:  # aiohttp.ClientError, OSError, TimeoutError: nothing answers there
        import aiohttp

        if not isinstance(e, aiohttp.ClientError | OSError | asyncio.TimeoutError):
            raise
        say(f"gpuwatchd notify: no daemon reachable at {args.url}: {type(e).__name__}: {e}", sys.stderr)
        return EXIT_UNREACHABLE
    if status != 200:
        why = data.get("error") if isinstance(data, dict) else data
        say(f"gpuwatchd notify: the daemon refused (HTTP {status}): {why}", sys.stderr)
        return EXIT_USAGE if status == 404 else EXIT_FAILED
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list) or not all(isinstance(r, dict) and isinstance(r.get("line"), str)
                                                for r in results):
        say(f"gpuwatchd notify: {not_gpuwatchd(args.url, 'receiver test answer', 'no list of results')}", sys.stderr)
        return EXIT_UNREACHABLE
    if not results:
        say("gpuwatchd notify: the daemon has no receivers: alerts go nowhere but the API", sys.stderr)
        return EXIT_USAGE
    for r in results:
        say(r["line"])
    return EXIT_OK if all(r.get("ok") is True for r in results) else EXIT_FAILED


def cmd_notify(args: argparse.Namespace) -> int:
    """``notify test``: 0 when every receiver took the message, 1 when one did not, 2 nothing to test."""
    if args.url:
        return _via_daemon(args)
    from gpuwatchd.config.files import missing, shown_path
    from gpuwatchd.config.loader import ConfigError, load_config
    from gpuwatchd.config.paths import DEFAULT_CONFIG_PATH

    path = args.config
    if path is not None and missing(path):
        print(f"gpuwatchd notify: {shown_path(path)}: file not found", file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = load_config(path, required=path is not None)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return EXIT_USAGE
    source = shown_path(path) if path is not None else (
        str(DEFAULT_CONFIG_PATH) if DEFAULT_CONFIG_PATH.exists() else "the built-in defaults"
    )
    receivers = list(cfg.notify.receivers)
    if not receivers:
        print(f"gpuwatchd notify: no receivers in {source} (notify.receivers): alerts go nowhere but the API "
              "(docs/notifications.md)", file=sys.stderr)
        return EXIT_USAGE
    if args.receiver:
        unknown = [n for n in args.receiver if n not in {r.name for r in receivers}]
        if unknown:
            names = ", ".join(r.name for r in receivers)
            print(f"gpuwatchd notify: unknown receiver {unknown[0]!r} in {source}; receivers: {names}", file=sys.stderr)
            return EXIT_USAGE
        receivers = [r for r in receivers if r.name in args.receiver]
    import asyncio

    from gpuwatchd.notify.receiver_test import send_tests

    results = asyncio.run(send_tests(cfg.notify, receivers, cfg.host))
    for line, _ in results:
        say(line)
    return EXIT_OK if all(ok for _, ok in results) else EXIT_FAILED
