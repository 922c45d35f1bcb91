"""``gpuwatchd doctor [--json]``: check this host's GPU set-up, one line per check with the fix for each warn/fail.

Exit 0 when everything passes, 1 on any warning, 2 on any failure. ``--sim DIR`` examines a running
``gpuwatchd sim`` instead of this machine (DIR is the sim's state dir, printed in its banner; docs/egpu.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gpuwatchd.cli.daemon_client import ClientSetupError, add_client_args, client_from_args
from gpuwatchd.config.loader import DEFAULT_CONFIG_PATH, Config, ConfigError, load_config
from gpuwatchd.doctor.context import DEFAULT_DEADLINE, SERVICE_USER, Host
from gpuwatchd.runtime.exitcodes import EXIT_USAGE
from gpuwatchd.sim.host_tree import MANIFEST
from gpuwatchd.sim.standin_abi import STATE_ENV


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser(
        "doctor",
        help="check the GPU set-up (driver, devices, GPUs, Thunderbolt, CUDA, the daemon); exit 0/1/2",
        description="One line per check (pass, warn, fail) with the fix for each warn and fail. Exit 0: all pass; "
        "1: a warning; 2: a failure. NVML and torch run in child processes killed after --deadline.",
    )
    d.add_argument("--json", action="store_true", help="print the results as JSON")
    d.add_argument("--config", type=Path, help=f"the daemon's config (default: {DEFAULT_CONFIG_PATH} if it exists)")
    d.add_argument("--url", help="the daemon's base URL (default: from the config's listen address)")
    d.add_argument("--root", type=Path, default=Path("/"), help="prefix of /proc, /sys and /dev (default: /)")
    d.add_argument("--user", default=SERVICE_USER, help=f"the user the daemon runs as (default: {SERVICE_USER})")
    d.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE,
                   help=f"seconds before a hung NVML or torch probe is killed (default {DEFAULT_DEADLINE:g})")
    d.add_argument("--kernel-log", type=Path, metavar="FILE",
                   help="read recent Xids from this saved kernel log (dmesg, journalctl -k) instead of the daemon's")
    d.add_argument("--sim", type=Path, metavar="DIR",
                   help="examine a running `gpuwatchd sim` (DIR: its state dir, as its banner prints)")
    add_client_args(d)


def host_from_args(args: argparse.Namespace) -> Host:
    """The host doctor examines: this machine, or the simulated one a ``gpuwatchd sim`` describes."""
    from gpuwatchd.cli.commands import default_status_url

    config, error = Config(), None
    path = args.config if args.config is not None else (DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None)
    if path is not None:
        try:
            config = load_config(path, required=True)
        except ConfigError as e:
            error = str(e).replace("\n", "; ")
    host = Host(root=args.root, config=config, config_path=path, config_error=error, deadline=args.deadline,
                service_user=args.user, url=args.url or default_status_url(path),
                kernel_log=args.kernel_log, client=client_from_args(args, config.web_config_file))  # fmt: skip
    if args.sim is not None:
        _simulated(host, args.sim, args.url)
    return host


def _simulated(host: Host, state_dir: Path, url: str | None) -> None:
    from gpuwatchd.sim.state import read_state

    doc = json.loads((state_dir / MANIFEST).read_text())
    host.root = Path(doc["root"])
    host.url = url or doc["url"]
    host.env = {**os.environ, STATE_ENV: doc["state"]}
    host.config = host.config.model_copy(
        update={"nvml": host.config.nvml.model_copy(update={"library_path": Path(doc["library_dir"])}),
                "state_dir": Path(doc["state_dir"])}
    )  # fmt: skip
    state = read_state(Path(doc["state"]))
    n = len(state.get("devices") or [])
    host.torch_facts = state.get("torch") or {
        "installed": True, "version": "2.5.1+cu121", "cuda": "12.1", "available": n > 0, "device_count": n,
    }  # fmt: skip


def cmd_doctor(args: argparse.Namespace) -> int:
    try:
        host = host_from_args(args)
    except ClientSetupError as e:
        print(f"gpuwatchd doctor: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, ValueError, KeyError) as e:
        # Not a check result: the simulation to examine is not there (not started, or another --state-dir).
        print(f"gpuwatchd doctor: --sim {args.sim}: cannot read the simulation's {MANIFEST}: {e}", file=sys.stderr)
        return EXIT_USAGE
    # Imported here: `gpuwatchd --help` and the other commands need none of the checks (aiohttp, sim, rules).
    from gpuwatchd.doctor.report import exit_code, render_json, render_text
    from gpuwatchd.doctor.run import run_checks

    results = run_checks(host)
    print(render_json(results) if args.json else render_text(results))
    return exit_code(results)
