"""``gpuwatchd probe [--gpu INDEX|UUID ...] [--probe NAME ...] [--json]``: run the torch health probes now.

With a daemon running it asks the daemon (``POST /api/v1/probe``), so the daemon's probe slots (probes.parallel) and
its baselines are used; without one it reads the GPUs with one NVML poll and runs the probes itself, with the
same baselines file in the state dir. Prints measured, baseline and expected figures and a verdict per probe.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwatchd.cli.arg_types import daemon_url
from gpuwatchd.runtime.daemon_client import (
    AUTH_HINT,
    ClientSetupError,
    DaemonClient,
    add_client_args,
    client_for,
    tls_problem,
)
from gpuwatchd.runtime.terminal import say

if TYPE_CHECKING:  # the command line imports this module for its parser: the models load when the command runs
    from gpuwatchd.config.loader import Config
    from gpuwatchd.model import Snapshot

NVML_POLL_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 5.0
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # a probe result of 64 GPUs is tens of KB


class NoDaemon(Exception):
    """Nothing listens at the URL (connection refused): the only case in which ``probe`` runs the probes itself."""


def _answer(status: int, raw: bytes) -> Any:
    """The JSON of an answer (bounded: runtime/json_answer.py); RuntimeError saying what came instead (an HTML 500
    page, a truncated body, JSON nested 100k deep)."""
    from gpuwatchd.runtime.json_answer import AnswerError, parse_answer

    try:
        return parse_answer(raw, max_bytes=MAX_ANSWER_BYTES)
    except AnswerError as e:
        text = raw[:200].decode("utf-8", "replace").strip().replace("\n", " ")
        what = "not JSON" if str(e) == "not JSON" else f"not a probe result ({e})"
        raise RuntimeError(f"the daemon answered HTTP {status} with a body that is {what}"
                           f"{': ' + repr(text) if text else ' (empty)'}") from None


async def ask_daemon(base_url: str, gpus: Sequence[str], probes: Sequence[str], timeout: float,
                     client: DaemonClient | None = None) -> dict[str, Any]:
    """POST the request; :class:`NoDaemon` when nothing listens (then the caller runs the probes itself).
    ``client``: TLS trust and basic auth for a daemon with a web config (runtime/daemon_client.py)."""
    import asyncio

    import aiohttp  # here, not at the top: every CLI start imports this module

    from gpuwatchd.runtime.http_body import read_capped

    t = aiohttp.ClientTimeout(total=timeout, connect=CONNECT_TIMEOUT_S)
    try:
        args = (client or DaemonClient()).session_args()
    except ClientSetupError as e:
        raise RuntimeError(str(e)) from None
    try:
        async with aiohttp.ClientSession(timeout=t, **args) as session, session.post(
            f"{base_url}/api/v1/probe", json={"gpus": list(gpus), "probes": list(probes)}
        ) as resp:
            if resp.status == 401:
                raise RuntimeError(f"the daemon refused: HTTP 401 ({AUTH_HINT})")
            raw = await read_capped(resp.content, MAX_ANSWER_BYTES + 1)
            if len(raw) > MAX_ANSWER_BYTES:
                raise RuntimeError(f"the daemon's answer is larger than {MAX_ANSWER_BYTES} bytes")
            body = _answer(resp.status, raw)
            if resp.status != 200:
                err = body.get("error") if isinstance(body, dict) else None
                raise RuntimeError(f"the daemon refused: HTTP {resp.status}: {err or body}")
            if not isinstance(body, dict):
                raise RuntimeError("the daemon answered something that is not a probe result")
            return body
    except (aiohttp.ClientConnectionError, OSError, asyncio.TimeoutError) as e:
        problem = tls_problem(base_url, e)
        if problem is not None:  # a daemon answers: never run the probes beside it
            raise RuntimeError(f"{base_url}: {problem}") from None
        if _refused(e):
            raise NoDaemon(str(e) or type(e).__name__) from None
        # Something is there: a timeout, a reset, a name that does not resolve. Running the probes here as well could
        # put two probe runs on one GPU (a daemon busy probing answers late), so this is an error, not "no daemon".
        if isinstance(e, asyncio.TimeoutError):
            raise RuntimeError(f"{base_url}: no answer within {timeout:g} s (connect {CONNECT_TIMEOUT_S:g} s); a"
                               " timeout is not 'no daemon', so the probes were not run here. A daemon running"
                               " probes answers when they end: raise --timeout") from None
        raise RuntimeError(f"{base_url}: {str(e)[:200] or type(e).__name__}; the probes were not run") from None


def _refused(e: BaseException) -> bool:
    """Nothing listens: the connection was refused (ECONNREFUSED; ENOENT for a unix socket path)."""
    import aiohttp

    if isinstance(e, aiohttp.ClientConnectorError):
        return e.os_error.errno in (errno.ECONNREFUSED, errno.ENOENT)
    return isinstance(e, ConnectionRefusedError)


def nvml_snapshot(config: Config) -> Snapshot:
    """One poll of the NVML worker (a child process, as in the daemon): the GPUs to probe, their links, processes."""
    from gpuwatchd.model import snapshot_from_dict
    from gpuwatchd.sources.nvml.protocol import HELLO
    from gpuwatchd.sources.nvml.worker_process import child_env, worker_argv

    opts: dict[str, Any] = {"interval": 0.1, "max_polls": 1, "top_n": config.processes.top_n}
    if config.nvml.library_path is not None:
        opts["library_path"] = str(config.nvml.library_path)
    proc = subprocess.run(
        [*worker_argv(sys.executable, "gpuwatchd.sources.nvml.worker.main"), json.dumps(opts)],
        env=child_env(os.environ, config.nvml.library_path), capture_output=True, text=True,
        timeout=NVML_POLL_TIMEOUT_S, check=False,
    )
    for line in proc.stdout.splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and HELLO not in data:
            data.pop("calls", None)  # the worker's NVML call counts, not a reading (the daemon's intake drops them)
            return snapshot_from_dict(data)
    raise RuntimeError(f"the NVML worker gave no snapshot (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")


async def run_direct(config: Config, gpus: Sequence[str], probes: Sequence[str]) -> dict[str, Any]:
    """No daemon: one NVML poll, then the probes through the same service the daemon uses."""
    import asyncio

    from gpuwatchd.model import Snapshot
    from gpuwatchd.probes.api import run_request
    from gpuwatchd.probes.service import ProbeService
    from gpuwatchd.runtime.clock import RealClock
    from gpuwatchd.runtime.startup import resolve_state_dir
    from gpuwatchd.store import Store

    snap = await asyncio.to_thread(nvml_snapshot, config)
    if not snap.nvml_ok:
        raise RuntimeError(f"NVML is not available ({snap.nvml_error}): no GPU to probe")
    clock = RealClock()
    store = Store()
    store.apply(Snapshot(**{**{f: getattr(snap, f) for f in snap.__dataclass_fields__}, "timestamp": clock.now()}))
    service = ProbeService(config, store, clock, resolve_state_dir(config, os.environ))
    return await run_request(service, list(gpus), list(probes))


def _fmt(key: str, value: Any) -> str:
    from gpuwatchd.probes.verdict import fmt_measure

    # fmt_measure gives "<label> <number> <unit>"; the table's column names the measure already.
    return " ".join(fmt_measure(key, float(value)).split()[-2:]) if isinstance(value, int | float) else "-"


def render(result: Mapping[str, Any]) -> str:
    """One row per measure (a probe without figures gets one row): GPU, probe, measure, figures, verdict."""
    if not result.get("available", True):
        return f"probes unavailable: {result.get('reason')}"
    rows: list[list[str]] = []
    for g in result.get("gpus") or []:
        gpu = str(g.get("index"))
        if not g.get("records"):
            rows.append([gpu, "-", "-", "-", "-", "-", str(g.get("skipped") or "skipped")])
        for r in g.get("records") or []:
            verdict = r["result"] + (f": {r['problem']}" if r.get("problem") else "")
            measures = r.get("measures") or {}
            if not measures:
                rows.append([gpu, r["probe"], "-", "-", "-", "-", verdict])
            for key, m in measures.items():
                expected = _fmt(key, m.get("expected"))
                if m.get("expected_name"):
                    expected += f" ({m['expected_name']})"
                row_verdict = "degraded: " + m["degraded"] if m.get("degraded") else verdict
                rows.append([gpu, r["probe"], key.split(".", 1)[1], _fmt(key, m.get("measured")),
                             _fmt(key, m.get("baseline")), expected, row_verdict])
    headers = ["GPU", "PROBE", "MEASURE", "MEASURED", "BASELINE", "EXPECTED", "VERDICT"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines) if rows else "No GPUs to probe."


def cmd_probe(config: Config, url: str, gpus: Sequence[str], probes: Sequence[str], *, as_json: bool,
              timeout: float, client: DaemonClient | None = None) -> int:
    """Exit 0 when every probe run passed or was degraded, 1 when one failed or none could run."""
    import asyncio

    try:
        try:
            result = asyncio.run(ask_daemon(url, gpus, probes, timeout, client))
            source = f"daemon at {url}"
        except NoDaemon:
            result = asyncio.run(run_direct(config, gpus, probes))
            source = "no daemon running: probes run directly"
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        say(f"gpuwatchd probe: {e}", sys.stderr)
        return 1
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(f"({source})")
        print(render(result))
    failed = not result.get("available", True) or any(
        r["result"] in ("fail", "error", "crash", "timeout") for g in result.get("gpus") or []
        for r in g.get("records") or []
    )
    return 1 if failed else 0




MAX_TIMEOUT_S = 86400.0  # a day: longer than any probe run, and finite (asyncio timers overflow on inf)


def _timeout(text: str) -> float:
    """``--timeout``: finite seconds in (0, MAX_TIMEOUT_S]; anything else is a one-line usage error (exit 2)."""
    try:
        value = float(text) if len(text) <= 32 else math.nan
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_TIMEOUT_S:  # also false for nan
        raise argparse.ArgumentTypeError(f"expected seconds in (0, {MAX_TIMEOUT_S:g}], got {text[:32]!r}")
    return value


def add_probe_parser(sub: Any) -> None:
    p = sub.add_parser("probe", help="run the torch health probes now (through the daemon when one runs)")
    p.add_argument("--gpu", action="append", default=[], metavar="INDEX|UUID", help="GPU to probe (repeatable; "
                   "default: every present GPU)")
    p.add_argument("--probe", action="append", default=[], choices=("gemm", "memory", "pcie", "launch"),
                   help="probe to run (repeatable; default: those enabled in the config)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--url", type=daemon_url, help="daemon base URL (default: from the config's listen address)")
    p.add_argument("--config", type=Path, help="config file (listen address, probes, state dir)")
    p.add_argument("--timeout", type=_timeout, default=900.0,
                   help=f"seconds to wait for the daemon's answer (0 < SECONDS <= {MAX_TIMEOUT_S:g})")
    add_client_args(p)


def cmd_probe_args(args: argparse.Namespace, default_url: str) -> int:
    from gpuwatchd.config.loader import ConfigError, load_config

    try:
        config = load_config(args.config, required=args.config is not None)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 1
    url = (args.url or default_url).rstrip("/")
    try:
        client = client_for(args, args.config)
    except ClientSetupError as e:
        print(f"gpuwatchd probe: {e}", file=sys.stderr)
        return 1
    return cmd_probe(config, url, args.gpu, args.probe, as_json=args.json, timeout=args.timeout, client=client)
