"""``gpuwatchd doctor [--json] [--python PATH]``: check this host's GPU set-up, one line per check with the fix for
each warn/fail. ``--python`` (default: ``probes.python``) is the interpreter whose torch is checked against the driver.

Exit 0 when everything passes, 1 on any warning, 2 on any failure. ``--sim DIR`` examines a running
``gpuwatchd sim`` instead of this machine (DIR is the sim's state dir, printed in its banner; docs/egpu.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatchd.cli.arg_types import MAX_DEADLINE_SECONDS, daemon_url, deadline_seconds
from gpuwatchd.config.files import shown_path
from gpuwatchd.config.paths import DEFAULT_CONFIG_PATH
from gpuwatchd.doctor.defaults import DEFAULT_DEADLINE, SERVICE_USER
from gpuwatchd.runtime.daemon_client import ClientSetupError, add_client_args, client_from_args, default_status_url
from gpuwatchd.runtime.exitcodes import EXIT_USAGE
from gpuwatchd.sim.host_tree import MANIFEST
from gpuwatchd.sim.standin_abi import STATE_ENV

if TYPE_CHECKING:
    from gpuwatchd.doctor.context import Host


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser(
        "doctor",
        help="check the GPU set-up (driver, devices, GPUs, Thunderbolt, CUDA, the daemon); exit 0/1/2",
        description="One line per check (pass, warn, fail) with the fix for each warn and fail. Exit 0: all pass; "
        "1: a warning; 2: a failure. NVML and torch run in child processes killed after --deadline.",
    )
    d.add_argument("--json", action="store_true", help="print the results as JSON")
    d.add_argument("--config", type=Path, help=f"the daemon's config (default: {DEFAULT_CONFIG_PATH} if it exists)")
    d.add_argument("--url", type=daemon_url,
                   help="the daemon's base URL (default: from the config's listen address)")
    d.add_argument("--root", type=Path, default=Path("/"), help="prefix of /proc, /sys and /dev (default: /)")
    d.add_argument("--user", default=SERVICE_USER, help=f"the user the daemon runs as (default: {SERVICE_USER})")
    d.add_argument("--deadline", type=deadline_seconds, default=DEFAULT_DEADLINE,
                   help=f"seconds before a hung NVML or torch probe is killed (default {DEFAULT_DEADLINE:g}, at most "
                   f"{MAX_DEADLINE_SECONDS:g})")
    d.add_argument("--kernel-log", type=Path, metavar="FILE",
                   help="read recent Xids from this saved kernel log (dmesg, journalctl -k) instead of the daemon's")
    d.add_argument("--python", metavar="PATH",
                   help="the interpreter whose torch/CUDA to check against the driver: the environment that trains "
                   "(default: the config's probes.python when set, else gpuwatchd's own)")
    d.add_argument("--sim", type=Path, metavar="DIR",
                   help="examine a running `gpuwatchd sim` (DIR: its state dir, as its banner prints)")
    add_client_args(d)


def host_from_args(args: argparse.Namespace) -> Host:
    """The host doctor examines: this machine, or the simulated one a ``gpuwatchd sim`` describes."""
    # Imported here, as in every command: `gpuwatchd --help` loads none of the config models (msgspec, PyYAML).
    from gpuwatchd.config.loader import Config, ConfigError, load_config
    from gpuwatchd.doctor.context import Host

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
    python = args.python or (str(config.probes.python) if config.probes.python is not None else None)
    if python is not None:
        host.python = python
        host.torch_facts = None  # a real interpreter named: run it, even against a simulated host's driver
    return host


def _simulated(host: Host, state_dir: Path, url: str | None) -> None:
    import argparse

    from gpuwatchd.config.types import replace
    from gpuwatchd.sim.host_tree import read_manifest
    from gpuwatchd.sim.state import read_state_file

    doc = read_manifest(state_dir)
    try:
        sim_url = daemon_url(doc["url"])
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"'url': {e}") from None
    host.root = Path(doc["root"])
    host.url = url or sim_url
    host.env = {**os.environ, STATE_ENV: doc["state"]}
    host.config = replace(host.config, nvml=replace(host.config.nvml, library_path=Path(doc["library_dir"])),
                          state_dir=Path(doc["state_dir"]))
    state = read_state_file(Path(doc["state"]))
    devices = state.get("devices")
    n = len(devices) if isinstance(devices, list) else 0
    torch = state.get("torch")
    host.torch_facts = torch if isinstance(torch, dict) else {
        "installed": True, "version": "2.5.1+cu121", "cuda": "12.1", "available": n > 0, "device_count": n,
    }  # fmt: skip


def cmd_doctor(args: argparse.Namespace) -> int:
    try:
        host = host_from_args(args)
    except ClientSetupError as e:
        print(f"gpuwatchd doctor: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, ValueError) as e:
        # Not a check result: the simulation to examine is not there (not started, or another --state-dir).
        print(f"gpuwatchd doctor: --sim {shown_path(args.sim)}: cannot read the simulation's {MANIFEST}: {e}",
              file=sys.stderr)
        return EXIT_USAGE
    # Imported here: `gpuwatchd --help` and the other commands need none of the checks (aiohttp, sim, rules).
    from gpuwatchd.doctor.kernel_log import read_file
    from gpuwatchd.doctor.report import exit_code, render_json, render_text
    from gpuwatchd.doctor.run import run_checks

    klog = None
    if host.kernel_log is not None:
        # a file the user named: one that cannot be read (a FIFO, /dev/zero, too large) is the command's error
        klog = read_file(host.kernel_log)
        if klog.error is not None:
            print(f"gpuwatchd doctor: --kernel-log {klog.error.removeprefix('cannot read ')}", file=sys.stderr)
            return EXIT_USAGE
    results = run_checks(host, klog)
    print(render_json(results) if args.json else render_text(results))
    return exit_code(results)
