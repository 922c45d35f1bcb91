"""``gpuwatchd sim``: the real daemon against the stand-in NVML driver, driven by a scenario or a captured XML.

Builds (or reuses) the stand-in ``libnvidia-ml.so.1``, writes the first state, starts the :class:`Player` and the
:class:`~gpuwatchd.daemon.Daemon` on one shared :class:`~gpuwatchd.runtime.clock.ScaledClock`, so with ``--speed X``
scenario time and the daemon's time are the same number; then serves until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from gpuwatchd.config.files import InputFileError, shown_path
from gpuwatchd.config.loader import Config, load_config
from gpuwatchd.config.types import fields_set, replace
from gpuwatchd.probes.config import sim_probes
from gpuwatchd.runtime.clock import ScaledClock
from gpuwatchd.runtime.exitcodes import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE
from gpuwatchd.sim.csv_replay import CsvReplayError, load_csv_scenario
from gpuwatchd.sim.host_tree import write_manifest
from gpuwatchd.sim.kmsg_replay import KernelLogError, ReplayRing, feed_when_ready, load_kernel_log_async
from gpuwatchd.sim.pci_tree import mirror_sysfs
from gpuwatchd.sim.player import Player
from gpuwatchd.sim.probes import SimProbes
from gpuwatchd.sim.resume import load_sim_clock, save_sim_clock
from gpuwatchd.sim.scenario import (
    SCENARIO_DIR,
    Scenario,
    ScenarioError,
    load_scenario,
    load_scenario_file,
    scenario_names,
)
from gpuwatchd.sim.standin_abi import MAX_SIM_GPUS, STATE_ENV
from gpuwatchd.sim.worker import WORKER_MODULE as SIM_WORKER_MODULE
from gpuwatchd.web.status import scenario_clock

log = logging.getLogger(__name__)

# Scenario time runs at most 10000x wall time (a day in under 9 s): faster, the player's steps and the daemon's
# timers are far below what the host can schedule and the run shows nothing real. Slowest: 1/1000 (debugging).
MIN_SPEED = 0.001
MAX_SPEED = 10_000.0
FIRST_SNAPSHOT_WAIT_S = 30.0  # wall seconds the scenario clock waits for the daemon's first snapshot


def list_scenarios() -> list[tuple[str, str]]:
    """(name, what the user should see) of every built-in scenario, sorted by name."""
    out = []
    for name in scenario_names():
        try:
            description = load_scenario_file(SCENARIO_DIR / f"{name}.yml").description
        except ScenarioError as e:  # a broken install must not take the list with it
            description = f"(cannot be loaded: {e})"
        out.append((name, description))
    return out


async def run_sim(*, scenario: str | None, from_xml: Path | None, gpus: int | None, speed: float,
                  listen: str | None, config_path: Path | None, state_dir: Path | None,
                  web_config_file: Path | None = None,
                  out: TextIO | None = None, kernel_log: Path | None = None, from_csv: Path | None = None,
                  resume: bool = False, freeze_gc: bool = False) -> int:
    """Run the simulation until SIGINT/SIGTERM; returns the process exit code.

    ``ConfigError`` from a bad ``--config`` propagates (the CLI owns that exit code); scenario, XML and option
    problems are printed to stderr and return ``EXIT_USAGE``; daemon start-up failures return their exit code.
    """
    out = out or sys.stdout
    problem = _check_options(scenario, from_xml, speed, gpus, from_csv)
    if problem:
        print(f"gpuwatchd sim: {problem}", file=sys.stderr)
        return EXIT_USAGE
    config = load_config(config_path, required=True) if config_path is not None else Config()
    try:
        scen = _load(scenario, gpus) if scenario is not None else None
        if from_csv is not None:
            scen = load_csv_scenario(from_csv)
    except ScenarioError as e:
        print(str(e), file=sys.stderr)
        return EXIT_USAGE
    except (CsvReplayError, InputFileError, OSError) as e:
        print(f"gpuwatchd sim: --from-csv {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        kernel_entries = await load_kernel_log_async(kernel_log) if kernel_log is not None else []
    except KernelLogError as e:
        print(f"gpuwatchd sim: {e}", file=sys.stderr)
        return EXIT_USAGE
    # --resume: the scenario goes on where the last run with this --state-dir left it (sim/resume.py).
    saved = load_sim_clock(state_dir) if resume and state_dir is not None else None
    clock = ScaledClock(start=saved.now_for(speed) if saved else None, speed=speed)
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-sim-") as tmp_name:
        tmp = Path(tmp_name)
        state_path = tmp / "state"
        # The simulated host's kernel ring (the real /dev/kmsg knows nothing of simulated GPUs).
        ring = ReplayRing(tmp / "kmsg")
        player: Player | None = None
        if scen is not None:
            player = Player(scen, state_path, clock, sysfs_root=tmp / "sysfs", kmsg=ring,
                            start=saved.start if saved else None)
            player.started = saved is not None  # a resumed scenario's clock goes on from its saved start
            player.write_initial()
            title, expect = f"scenario {scen.name!r}", scen.description
        else:
            assert from_xml is not None
            try:
                title, expect = _write_capture(from_xml, state_path, tmp / "sysfs")
            except (OSError, ValueError) as e:
                name, msg = shown_path(from_xml), str(e)
                print(f"gpuwatchd sim: --from-xml {msg if msg.startswith(name) else f'{name}: {msg}'}", file=sys.stderr)
                return EXIT_USAGE
        try:
            libdir = _library_dir(scen, tmp)
        except (OSError, RuntimeError) as e:
            print(f"gpuwatchd sim: cannot build the stand-in NVML driver: {e}", file=sys.stderr)
            return EXIT_USAGE
        # Imported once the inputs are known good: a bad file is refused without loading the whole daemon.
        from gpuwatchd.daemon import Daemon, DaemonError

        config = _sim_config(config, libdir, state_dir or (tmp / "state-dir"), state_dir is not None, tmp / "sysfs")
        config = replace(config, kernel_log=replace(config.kernel_log, path=ring.path))
        daemon = Daemon(config, config_path=config_path, clock=clock, listen=listen,
                        worker_env={**os.environ, STATE_ENV: str(state_path)}, worker_module=SIM_WORKER_MODULE,
                        probe_sim=SimProbes(state_path), web_config_file=web_config_file, freeze_gc=freeze_gc)
        try:
            await daemon.start()
        except DaemonError as e:
            print(f"gpuwatchd sim: {e}", file=sys.stderr)
            return e.exit_code
        print(banner(title, expect, daemon.url, scen=scen, speed=speed, state_path=state_path), file=out, flush=True)
        if daemon.state_dir is not None:
            write_manifest(daemon.state_dir, root=tmp / "sysfs", library_dir=libdir, state=state_path, url=daemon.url)
            print(f"  check it: gpuwatchd doctor --sim {daemon.state_dir}", file=out, flush=True)
        clock_saver = None
        if player is not None:
            daemon.status_extra = functools.partial(_scenario_status, player)
            if daemon.state_dir is not None:
                clock_saver = asyncio.create_task(_save_clock(player, daemon.state_dir), name="sim clock")
        played: list[str] = []  # why the player stopped, when it did

        def player_failed(why: str) -> None:
            played.append(why)
            daemon.request_stop()

        task = (asyncio.create_task(_play(player, lambda: daemon.store.latest is not None, restart_clock=saved is None,
                                          on_error=player_failed),
                                    name="scenario player") if player is not None else None)
        feeder = asyncio.create_task(feed_when_ready(ring, kernel_entries, lambda: daemon.store.latest is not None),
                                     name="kernel log replay")
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, daemon.request_stop)
        try:
            await daemon.wait_closed()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            for t in (task, feeder, clock_saver):
                if t is not None:
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await t
            await daemon.stop()
        if played:
            print(f"gpuwatchd sim: {played[0]}", file=sys.stderr)
            return EXIT_RUNTIME
        return EXIT_OK if daemon.failure is None else DaemonError.exit_code


async def _play(player: Player, has_snapshot: Callable[[], bool], *, restart_clock: bool,
                on_error: Callable[[str], None] | None = None) -> None:
    """Play the scenario from the daemon's first snapshot: its ``at: 5`` is 5 s after the daemon first saw the
    GPUs, however long the start took on a busy machine (a hang due 1.25 s in at --speed 4 otherwise began before
    the first poll of the GPU, which was then never seen). Until then the state of t=0 is what the stand-in serves.
    A daemon that gets no first snapshot (its first NVML calls block) starts the clock after
    ``FIRST_SNAPSHOT_WAIT_S`` wall seconds. A resumed scenario keeps its saved start."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + FIRST_SNAPSHOT_WAIT_S
    while not has_snapshot() and loop.time() < give_up:
        await asyncio.sleep(0.05)
    if restart_clock:
        player.start = player.clock.now()
    player.started = True
    try:
        await player.run()
    except (ValueError, OSError, ArithmeticError) as e:
        # A state the load-time checks did not foresee, or a full disk: one line and a clean stop, never a
        # traceback from the player thread while the daemon goes on serving a frozen state.
        if on_error is None:
            raise
        on_error(f"scenario {player.scenario.name!r} stopped at t={player.scenario_time():.0f}s: {e}")


def _check_options(scenario: str | None, from_xml: Path | None, speed: float, gpus: int | None,
                   from_csv: Path | None = None) -> str | None:
    if sum(x is not None for x in (scenario, from_xml, from_csv)) != 1:
        return "give exactly one of --scenario NAME or --from-xml FILE, or --from-csv FILE"
    if not MIN_SPEED <= speed <= MAX_SPEED:  # also NaN
        return f"--speed {speed:g}: must be between {MIN_SPEED:g} and {MAX_SPEED:g}"
    if gpus is not None and not 0 <= gpus <= MAX_SIM_GPUS:
        return f"--gpus {gpus}: must be between 0 and {MAX_SIM_GPUS}"
    if gpus is not None and (from_xml is not None or from_csv is not None):
        return "--gpus applies to --scenario only (a capture has the GPUs it has)"
    return None


def _scenario_status(player: Player) -> dict[str, Any]:
    """The scenario clock for /api/v1/status (start None until the clock starts at the daemon's first snapshot)."""
    start = player.start if player.started else None
    return {"scenario": scenario_clock(player.scenario.name, start, player.clock.now(), player.clock.speed)}


async def _save_clock(player: Player, state_dir: Path) -> None:
    """The scenario clock for ``--resume``, every wall second (sim/resume.py)."""
    while True:
        with contextlib.suppress(OSError):  # a full disk costs the resume point, not the simulation
            save_sim_clock(state_dir, player.start, player.clock)  # type: ignore[arg-type]
        await asyncio.sleep(1.0)


def _load(name: str, gpus: int | None) -> Scenario:
    from gpuwatchd.sim.scenario_check import check_states

    scen = load_scenario(name)
    scen = scen.with_gpus(gpus) if gpus is not None else scen
    check_states(scen)
    return scen


def _write_capture(path: Path, state_path: Path, sysfs_root: Path) -> tuple[str, str]:
    from gpuwatchd.sim.capture import describe_capture, state_from_xml
    from gpuwatchd.sim.state import write_state

    state = state_from_xml(path)
    write_state(state_path, state)
    mirror_sysfs(sysfs_root, state)
    return f"capture {path.name}", describe_capture(path)


def _library_dir(scen: Scenario | None, tmp: Path) -> Path:
    if scen is not None and scen.library == "absent":
        empty = tmp / "no-driver"  # a directory without libnvidia-ml.so.1: NVML init fails with LibraryNotFound
        empty.mkdir()
        return empty
    from gpuwatchd.sim.build import build_standin

    return build_standin()


def _sim_config(config: Config, libdir: Path, state_dir: Path, explicit: bool, sysfs_root: Path) -> Config:
    nvml = replace(config.nvml, library_path=libdir)
    # The host's real /sys knows nothing of simulated GPUs: the player keeps a fake PCI tree in step with the
    # scenario, which is how the daemon's hot-plug watch sees an eGPU leave and come back.
    sysfs = replace(config.sysfs, root=sysfs_root)
    # Probes run on the CPU device on a minutes schedule (probes/config.py sim_probes).
    probes = sim_probes(config.probes, set(fields_set(config.probes)))
    # The stand-in's pids are fictitious: their /proc/PID/cgroup files (a scenario process' `cgroup`) are in the
    # fake tree, and so are the container runtimes' files, unless the config names other places.
    attr = config.attribution
    moved = {k: v for k, v in (("proc_root", sysfs_root / "proc"), ("host_root", sysfs_root))
             if k not in fields_set(attr)}
    update: dict[str, object] = {"nvml": nvml, "sysfs": sysfs, "probes": probes,
                                 "attribution": replace(attr, **moved)}
    # A simulation keeps its alert state and outbox away from a real daemon's, unless told where.
    if explicit or "state_dir" not in fields_set(config):
        update["state_dir"] = state_dir
    return replace(config, **update)


def banner(title: str, expect: str, url: str, *, scen: Scenario | None, speed: float, state_path: Path) -> str:
    """What ``gpuwatchd sim`` prints once the daemon is serving."""
    head = f"gpuwatchd sim: {title}"
    if scen is not None:
        head += f", {scen.gpus} GPU(s)" + (f", looping every {scen.duration:g} s" if scen.loop else "")
    if speed != 1:
        head += f", {speed:g}x speed"
    lines = [head]
    lines += [f"  {line}" for line in _wrap(expect, 100)]
    lines += [f"  metrics: {url}/metrics", f"  status:  {url}/api/v1/status", f"  alerts:  {url}/api/v1/alerts",
              f"  stand-in state file: {state_path}", "  Ctrl-C to stop."]
    return "\n".join(lines)


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]
