"""``gpuwatchd health ack GPU [--comment TEXT] [--replaced]``: tell a running daemon a GPU was inspected (or
replaced); its escalation and failure history start over and the acknowledgement is recorded
(``POST /api/v1/health/ack``, docs/remediation.md). The write token as for ``silence`` (``--token-file`` or
``$GPUWATCHD_WRITE_TOKEN``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuwatchd.cli.silence import TOKEN_ENV, _call, _error_text, _token
from gpuwatchd.runtime.daemon_client import ClientSetupError, add_client_args, client_for, tls_problem
from gpuwatchd.runtime.exitcodes import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

EXIT_REFUSED = 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser("health", help="acknowledge a GPU's health escalation on a running daemon")
    s = p.add_subparsers(dest="health_command", metavar="SUBCOMMAND", required=True)
    ack = s.add_parser("ack", help="mark a GPU inspected (or --replaced): clears its escalation and failure history")
    ack.add_argument("gpu", metavar="GPU", help="GPU index or UUID")
    ack.add_argument("--comment", "-c", default="", help="what was done (kept with the record)")
    ack.add_argument("--replaced", action="store_true", help="the GPU was replaced (default: inspected)")
    ack.add_argument("--by", default=None, help="who (default: USER@HOST)")
    ack.add_argument("--url", help="daemon base URL (default: from the config's listen address)")
    ack.add_argument("--config", type=Path, help="config file to read listen and web_config_file from")
    ack.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the daemon (default 5)")
    ack.add_argument("--token-file", type=Path, metavar="FILE",
                     help=f"file holding notify.api.write_token (default: ${TOKEN_ENV})")
    add_client_args(ack)


def cmd_health(args: argparse.Namespace, default_url: str, env: Mapping[str, str] = os.environ) -> int:
    """Exit 0 recorded, 1 refused by the daemon, 2 usage, 3 daemon unreachable."""
    import asyncio
    import getpass
    import socket

    try:
        client = client_for(args, args.config)
        token = _token(args, env)
    except ClientSetupError as e:
        print(f"gpuwatchd health: {e}", file=sys.stderr)
        return EXIT_USAGE
    url = (args.url or default_url).rstrip("/") + "/api/v1/health/ack"
    body = {"gpu": args.gpu, "kind": "replaced" if args.replaced else "inspected", "comment": args.comment,
            "by": args.by or f"{getpass.getuser()}@{socket.gethostname()}"}
    try:
        status, data = asyncio.run(_call("POST", url, client, token=token, timeout=args.timeout, body=body))
    except ClientSetupError as e:
        print(f"gpuwatchd health: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:
        import aiohttp

        if not isinstance(e, aiohttp.ClientError | OSError | asyncio.TimeoutError):
            raise
        why = tls_problem(url, e) or f"{type(e).__name__}: {e}".rstrip(": ")
        print(f"gpuwatchd health: no daemon reachable at {url}: {why}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if status != 200 or not isinstance(data, dict):
        print(f"gpuwatchd health: refused (HTTP {status}): {_error_text(data)}", file=sys.stderr)
        return EXIT_REFUSED
    cleared = data.get("cleared", {})
    print(f"{data.get('uuid')} marked {data.get('kind')}: escalation level {cleared.get('escalation', 0)} and "
          f"{cleared.get('failures', 0)} recorded failures cleared")
    return EXIT_OK
