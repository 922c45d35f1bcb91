"""Command line: ``gpuwatchd run | check-config | status | probe | sim | doctor | notify test | silence | health``.

Thin: parsing, logging, exit codes.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatchd import __version__
from gpuwatchd.cli.arg_types import daemon_url, deadline_seconds, timeout_seconds
from gpuwatchd.cli.probe import add_probe_parser, cmd_probe_args
from gpuwatchd.config.files import missing, shown_path
from gpuwatchd.config.paths import DEFAULT_CONFIG_PATH
from gpuwatchd.runtime.daemon_client import (
    ClientSetupError,
    DaemonClient,
    add_client_args,
    client_for,
    default_status_url,
)
from gpuwatchd.runtime.exitcodes import (
    EXIT_BROKEN_PIPE,
    EXIT_CODES_HELP,
    EXIT_CONFIG_INVALID,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)

if TYPE_CHECKING:
    from gpuwatchd.config.loader import Config

# Each command imports what it needs when it runs (the config models, aiohttp, the daemon): `gpuwatchd --help` and
# argument errors load none of them (tests/cli/test_imports.py).
log = logging.getLogger("gpuwatchd")


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuwatchd",
        description="Per-host GPU monitor: NVML metrics for Prometheus, and alerts for leaks, throttling, Xid "
        "errors and lost GPUs.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"gpuwatchd {__version__}")
    p.add_argument(
        "--log-level",
        default=os.environ.get("GPUWATCHD_LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
        help="log verbosity (default: info, or $GPUWATCHD_LOG_LEVEL)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="same as --log-level debug")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon", epilog=EXIT_CODES_HELP, formatter_class=p.formatter_class)
    run.add_argument(
        "--config",
        type=Path,
        help=f"YAML config file (default: {DEFAULT_CONFIG_PATH} if it exists, else built-in defaults)",
    )
    run.add_argument("--listen", metavar="HOST:PORT", help="override the config's listen address")
    _add_web_config_arg(run)

    check = sub.add_parser("check-config", help="validate a config file and exit (0 valid, 1 invalid, 2 missing)")
    check.add_argument("file", type=Path)

    status = sub.add_parser("status", help="show GPUs, processes and alerts of a running daemon")
    status.add_argument("--url", type=daemon_url, help="daemon base URL (default: from the config's listen address)")
    status.add_argument("--config", type=Path, help=f"config file to read listen from (default: {DEFAULT_CONFIG_PATH})")
    shape = status.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="print the raw status JSON instead of tables")
    shape.add_argument("--watch", nargs="?", type=deadline_seconds, const=2.0, metavar="SECONDS",
                       help="live view, redrawn every SECONDS (default 2) until Ctrl-C")
    status.add_argument("--timeout", type=timeout_seconds, default=5.0,
                        help="seconds to wait for the daemon's answers, in all (default 5)")
    add_client_args(status)

    add_probe_parser(sub)

    sim = sub.add_parser(
        "sim",
        help="run the daemon against the stand-in NVML driver (no GPU needed)",
        description="Run the real daemon against a simulated GPU host: a named scenario or a captured "
        "`nvidia-smi -q -x` file.",
    )
    src = sim.add_mutually_exclusive_group()
    src.add_argument(
        "--scenario", help="scenario name (see --list) or a scenario file (.yml, docs/scenarios.md); default: idle"
    )
    src.add_argument("--from-xml", type=Path, metavar="FILE", help="replay a captured `nvidia-smi -q -x` file")
    src.add_argument("--from-csv", type=Path, metavar="FILE",
                     help="replay a per-second `nvidia-smi --query-gpu=timestamp,...,memory.used,... --format=csv -l 1`"
                     " (or --query-compute-apps) log")
    sim.add_argument("--kernel-log", type=Path, metavar="FILE",
                     help="replay a captured kernel log (dmesg, dmesg -T/-x/--time-format iso, journalctl -k, syslog)"
                     " into the daemon's kernel-log source, as if it were the live ring")
    src.add_argument("--list", action="store_true", help="list the scenarios and exit")
    sim.add_argument("--gpus", type=int, help="number of simulated GPUs (scenario default if unset)")
    sim.add_argument("--speed", type=float, default=1.0, help="run scenario time this many times faster (default 1)")
    sim.add_argument("--listen", metavar="HOST:PORT", help="listen address (default: the config's)")
    sim.add_argument("--config", type=Path, help="YAML config file (default: built-in defaults)")
    _add_web_config_arg(sim)
    sim.add_argument("--state-dir", type=Path, help="where the simulated daemon keeps state (default: a temp dir)")
    sim.add_argument("--resume", action="store_true",
                     help="with --state-dir: go on with the scenario where the last run there stopped")
    from gpuwatchd.cli.doctor import add_parser as add_doctor
    from gpuwatchd.cli.health import add_parser as add_health
    from gpuwatchd.cli.notify_test import add_parser as add_notify
    from gpuwatchd.cli.silence import add_parser as add_silence

    add_doctor(sub)
    add_notify(sub)
    add_silence(sub)
    add_health(sub)
    return p


def _add_web_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--web.config.file", dest="web_config_file", type=Path, metavar="FILE",
                   help="TLS and basic auth for the endpoints, in the Prometheus exporter-toolkit web config format "
                   "(docs/security.md); overrides the config's web_config_file")


def _check_web_config(path: Path | None) -> int | None:
    """None when ``path`` is unset or a usable web config file; else print why and return the exit code."""
    if path is None:
        return None
    from gpuwatchd.web.webconfig import WebConfigError, load_web_config

    if missing(path):
        _err(f"--web.config.file {shown_path(path)}: file not found")
        return EXIT_USAGE
    try:
        load_web_config(path)
    except WebConfigError as e:
        _err(f"--web.config.file {shown_path(path)}: {e}")
        return EXIT_CONFIG_INVALID
    return None


def _setup_logging(level: str) -> None:
    # Under systemd the journal stamps each line already; elsewhere add the time.
    fmt = "%(levelname)s %(name)s: %(message)s"
    if not os.environ.get("JOURNAL_STREAM"):
        fmt = "%(asctime)s " + fmt
    logging.basicConfig(level=level.upper(), format=fmt, stream=sys.stderr)


def _err(msg: str) -> None:
    from gpuwatchd.runtime.terminal import say  # the message may hold what a daemon answered

    say(f"gpuwatchd: {msg}", sys.stderr)


def _load(path: Path | None) -> Config | int:
    """Load the config or print why not and return the exit code."""
    from gpuwatchd.config.loader import ConfigError, load_config

    if path is not None and missing(path):
        _err(f"{shown_path(path)}: file not found")
        return EXIT_USAGE
    try:
        return load_config(path, required=path is not None)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return EXIT_CONFIG_INVALID


def cmd_check_config(path: Path) -> int:
    cfg = _load(path)
    if isinstance(cfg, int):
        return cfg
    print(f"{path}: OK")
    return EXIT_OK


def cmd_run(config_path: Path | None, listen: str | None, web_config_file: Path | None = None) -> int:
    import asyncio

    from gpuwatchd.config.loader import parse_listen
    from gpuwatchd.daemon import Daemon, DaemonError

    cfg = _load(config_path)
    if isinstance(cfg, int):
        return cfg
    bad_web_config = _check_web_config(web_config_file)
    if bad_web_config is not None:
        return bad_web_config
    if config_path is None and not DEFAULT_CONFIG_PATH.exists():
        log.info("no config file at %s; using built-in defaults", DEFAULT_CONFIG_PATH)
    if listen is not None:
        try:
            parse_listen(listen)
        except ValueError as e:
            _err(f"--listen: {e}")
            return EXIT_USAGE
    daemon = Daemon(cfg, config_path=config_path, listen=listen, web_config_file=web_config_file, freeze_gc=True)
    try:
        return asyncio.run(daemon.serve())
    except DaemonError as e:
        _err(str(e))
        return e.exit_code
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        return EXIT_OK


def cmd_status(url: str | None, config_path: Path | None, as_json: bool, timeout: float,
               client: DaemonClient | None = None) -> int:
    import asyncio

    from gpuwatchd.cli.status import render_status
    from gpuwatchd.runtime.status_client import StatusUnavailable, fetch_status

    base = (url or default_status_url(config_path)).rstrip("/")
    try:
        status, alerts = asyncio.run(fetch_status(base, timeout=timeout, client=client))
    except StatusUnavailable as e:
        _err(str(e))
        return EXIT_UNREACHABLE
    if as_json:
        import json

        # json.dumps escapes every control character (ASCII output): terminal-safe as is.
        print(json.dumps({"status": status, "alerts": alerts}, indent=2, sort_keys=True))
        return EXIT_OK
    from gpuwatchd.runtime.json_answer import RENDER_ERRORS, not_gpuwatchd

    try:
        text = render_status(status, alerts)
    except RENDER_ERRORS as e:  # a value of a type no gpuwatchd sends, below what the shape check covers
        _err(not_gpuwatchd(base, "status", f"{type(e).__name__} while showing it"))
        return EXIT_UNREACHABLE
    print(text)
    return EXIT_OK


def cmd_sim(args: argparse.Namespace) -> int:
    import asyncio

    from gpuwatchd.config.loader import ConfigError, parse_listen
    from gpuwatchd.sim.runner import list_scenarios, run_sim
    from gpuwatchd.sim.scenario import looks_like_path

    scenarios = dict(list_scenarios())
    if args.list:
        for name, description in scenarios.items():
            print(name)
            print(textwrap.fill(description, width=100, initial_indent="    ", subsequent_indent="    "))
        return EXIT_OK
    if args.config is not None and missing(args.config):
        _err(f"{shown_path(args.config)}: file not found")
        return EXIT_USAGE
    if args.listen is not None:
        try:
            parse_listen(args.listen)
        except ValueError as e:
            _err(f"--listen: {e}")
            return EXIT_USAGE
    bad_web_config = _check_web_config(args.web_config_file)
    if bad_web_config is not None:
        return bad_web_config
    scenario = args.scenario if args.scenario or args.from_xml or args.from_csv else "idle"
    if scenario is not None and scenario not in scenarios and not looks_like_path(scenario):
        # a bare word is a built-in name, never a file of the current directory that happens to be called so
        hint = f"; for the file {scenario!r} in this directory write ./{scenario}" if not missing(scenario) else ""
        _err(f"unknown scenario {shown_path(scenario)!r}; choose one of: {', '.join(scenarios)}, or give a scenario "
             f"file (./NAME or NAME.yml){hint}")
        return EXIT_USAGE
    try:
        return asyncio.run(
            run_sim(
                scenario=scenario,
                from_xml=args.from_xml,
                from_csv=args.from_csv,
                resume=args.resume,
                kernel_log=args.kernel_log,
                gpus=args.gpus,
                speed=args.speed,
                listen=args.listen,
                config_path=args.config,
                state_dir=args.state_dir,
                web_config_file=args.web_config_file,
                freeze_gc=True,
            )
        )
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return EXIT_CONFIG_INVALID
    except KeyboardInterrupt:
        return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpuwatchd`` command."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`gpuwatchd sim --list | head`): stop quietly, as `cat` or `seq` do. Point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    _setup_logging("debug" if args.verbose else args.log_level)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command == "check-config":
        return cmd_check_config(args.file)
    if args.command == "run":
        return cmd_run(args.config, args.listen, args.web_config_file)
    if args.command == "status":
        try:
            client = client_for(args, args.config)
        except ClientSetupError as e:
            _err(str(e))
            return EXIT_USAGE
        if args.watch is not None:
            from gpuwatchd.cli.watch import run_watch

            base = (args.url or default_status_url(args.config)).rstrip("/")
            return run_watch(base, args.watch, args.timeout, client)
        return cmd_status(args.url, args.config, args.json, args.timeout, client)
    if args.command == "doctor":
        from gpuwatchd.cli.doctor import cmd_doctor

        return cmd_doctor(args)
    if args.command == "probe":
        return cmd_probe_args(args, default_status_url(args.config))
    if args.command == "notify":
        from gpuwatchd.cli.notify_test import cmd_notify

        return cmd_notify(args)
    if args.command == "silence":
        from gpuwatchd.cli.silence import cmd_silence

        return cmd_silence(args, default_status_url(args.config))
    if args.command == "health":
        from gpuwatchd.cli.health import cmd_health

        return cmd_health(args, default_status_url(args.config))
    return cmd_sim(args)
