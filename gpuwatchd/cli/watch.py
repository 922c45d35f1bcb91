"""``gpuwatchd status --watch [SECONDS]``: a live terminal view of a running daemon, redrawn in place.

Reads ``/api/v1/status`` and ``/api/v1/alerts`` like ``status`` (same URL, TLS and auth options) every SECONDS and
draws them with ``rich`` (imported here only: ``gpuwatchd --help`` and the daemon never load it). A daemon that
stops answering (a restart, a reload gone wrong) leaves the last picture on screen under a red line saying since
when and why; the view picks up again when the daemon is back. Ctrl-C ends it with exit code 0; on a pipe (not a
terminal) each refresh is printed as a new frame, and a reader that goes away (``| head``) ends it quietly.
"""

from __future__ import annotations

import asyncio
import errno
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

from gpuwatchd.cli.status import (
    advice_text,
    alert_advice,
    alert_state,
    gpu_index,
    gpu_name,
    more_processes,
    owner_text,
    uncounted_alerts,
)
from gpuwatchd.runtime.daemon_client import DaemonClient
from gpuwatchd.runtime.json_answer import RENDER_ERRORS, not_gpuwatchd
from gpuwatchd.runtime.status_client import DaemonRefused, StatusUnavailable, fetch_status
from gpuwatchd.runtime.terminal import safe_tree, terminal_safe

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

GIB = 1024**3
MIB = 1024**2
DEFAULT_INTERVAL = 2.0
MIN_INTERVAL = 0.2  # a faster refresh only costs the daemon CPU; NVML is polled once a second anyway
# Clock-event reasons that are not throttling (an idle GPU lowers its clocks; an application clock setting).
NOT_THROTTLE = frozenset({"gpu_idle", "applications_clocks_setting"})
STATE_STYLE = {"firing": "bold red", "pending": "yellow", "silenced": "dim", "inhibited": "dim", "resolved": "green"}
HEALTH_STYLE = {"healthy": "green", "degraded": "yellow", "unhealthy": "bold red", "unknown": "dim"}


def _num(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool)


def fmt_bytes(v: Any) -> str:
    if not _num(v):
        return "-"
    return f"{v / GIB:.1f} GiB" if abs(v) >= GIB else f"{v / MIB:.0f} MiB"


def fmt_duration(s: Any) -> str:
    if not _num(s):
        return "-"
    s = max(0, round(s))
    if s < 90:
        return f"{s}s"
    if s < 5400:
        return f"{round(s / 60)}m"
    return f"{s / 3600:.1f}h"


def fmt_rate(bps: Any) -> str:
    """Bytes per second as a signed per-minute change: "+684 MiB/min"."""
    if not _num(bps):
        return "-"
    per_min = bps * 60
    sign = "+" if per_min >= 0 else "-"
    return f"{sign}{fmt_bytes(abs(per_min))}/min"


def _link(g: Mapping[str, Any], r: Mapping[str, Any]) -> str:
    link = g.get("link") or {}
    gen = link.get("current_generation", r.get("pcie_link_generation"))
    width = link.get("current_width", r.get("pcie_link_width"))
    max_gen = link.get("max_generation", r.get("pcie_link_max_generation"))
    max_width = link.get("max_width", r.get("pcie_link_max_width"))
    if gen is None and width is None:
        text = "-"
    else:
        text = f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"
        text += f" / Gen{max_gen if max_gen is not None else '?'} x{max_width if max_width is not None else '?'}"
    dock = g.get("dock")
    if isinstance(dock, dict):
        speed = dock.get("rx_speed_bps")
        lanes = dock.get("rx_lanes")
        tb = f"TB{dock.get('generation') or '?'} {lanes or '?'}x{speed / 1e9:.0f}Gb/s" if _num(speed) else "TB"
        if dock.get("authorized") is False:
            tb += " UNAUTHORIZED"
        text += f"\n{tb}"
    return text


def _clocks(r: Mapping[str, Any]) -> str:
    c = r.get("clocks_hz") or {}
    if not _num(c.get("sm")):
        return "-"
    mem = f"/{c['memory'] / 1e6:.0f}" if _num(c.get("memory")) else ""
    return f"{c['sm'] / 1e6:.0f}{mem} MHz"


def _health(g: Mapping[str, Any]) -> tuple[str, str | None, str | None]:
    """(state, reason, action): the daemon's health verdict when it gives one, else what presence says."""
    h = g.get("health")
    action = advice_text(h) if isinstance(h, dict) else None  # the daemon's advice, the one chat got
    if isinstance(h, dict) and h.get("state") and h["state"] != "unknown":
        return str(h["state"]), None if h["state"] == "healthy" else h.get("reason"), action
    state = g.get("state")
    if state == "lost":
        return "unhealthy", "lost: stopped answering (fell off the bus, or its dock was pulled)", action
    if state == "removed":
        return "unhealthy", "removed: gone from the bus", action
    return "ok" if state == "present" else str(state or "?"), None, action


def render_view(status: Mapping[str, Any], alerts: Sequence[Mapping[str, Any]], *, interval: float,
                now: float, problem: str | None = None, last_ok: float | None = None) -> RenderableType:
    """One frame: header, GPUs, health notes, processes, docks, alerts (pure: data in, renderable out).

    Every string from the daemon is made terminal-safe (``terminal.safe_tree``) and reaches rich as a ``Text``,
    never as markup: a process name ``[/bold]`` raised MarkupError, ``[link=...]`` made a link, ESC sequences
    reached the terminal."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    status, alerts = safe_tree(status), safe_tree(alerts)
    if problem is not None:
        problem = terminal_safe(problem)

    daemon = status.get("daemon") or {}
    nvml = status.get("nvml") or {}
    head = Text()
    head.append(f"gpuwatchd {daemon.get('version') or '?'} on {daemon.get('host') or '?'}", style="bold")
    if nvml.get("ok") is True:
        head.append(f"  NVML up, driver {nvml.get('driver_version') or '?'}")
    elif nvml.get("ok") is False:
        head.append(f"  NVML down: {nvml.get('error') or 'unknown'}", style="red")
    if nvml.get("stale"):
        head.append("  data stale", style="yellow")
    scenario = status.get("scenario")
    if isinstance(scenario, dict):
        head.append(f"  sim {scenario.get('name')} t={fmt_duration(scenario.get('time'))}", style="dim")
    head.append(f"  every {interval:g}s  {time.strftime('%H:%M:%S', time.localtime(now))}  Ctrl-C quits",
                style="dim")
    parts: list[RenderableType] = [head]
    if problem is not None:
        since = f" (last answer {fmt_duration(now - last_ok)} ago)" if last_ok is not None else ""
        parts.append(Text(f"daemon not answering{since}, retrying: {problem}", style="bold red"))

    gpus = [g for g in status.get("gpus") or [] if isinstance(g, dict)]
    t = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    for col in ("GPU", "NAME", "HEALTH", "UTIL", "MEMORY", "TEMP", "POWER", "CLOCKS", "P", "PCIE LINK",
                "THROTTLE", "PROBE"):
        t.add_column(col, no_wrap=col not in ("NAME", "PCIE LINK", "THROTTLE", "PROBE"),
                     justify="right" if col in ("UTIL", "TEMP", "POWER") else "left")
    notes: list[Text] = []
    for g in gpus:
        r = g.get("readings") or {}
        hstate, reason, action = _health(g)
        used, total = r.get("memory_used_bytes"), r.get("memory_total_bytes")
        mem = f"{used / GIB:.1f}/{total / GIB:.1f} GiB" if _num(used) and _num(total) and total else "-"
        reasons = [x for x in r.get("clocks_event_reasons_active") or [] if x not in NOT_THROTTLE]
        probe = g.get("probe") or {}
        t.add_row(
            Text(gpu_index(g)),
            Text(str(g.get("name") or "-")),
            Text(hstate if g.get("state") == "present" else f"{hstate} ({g.get('state')})",
                 style=HEALTH_STYLE.get(hstate, "")),
            f"{r['utilization_gpu_ratio'] * 100:.0f}%" if _num(r.get("utilization_gpu_ratio")) else "-",
            mem,
            f"{r['temperature_celsius']:.0f}C" if _num(r.get("temperature_celsius")) else "-",
            f"{r['power_watts']:.0f}W" if _num(r.get("power_watts")) else "-",
            Text(_clocks(r)),
            f"P{r['pstate']}" if _num(r.get("pstate")) else "-",
            Text(_link(g, r)),
            Text(", ".join(map(str, reasons)) or "none", style="yellow" if reasons else ""),
            Text(str(probe.get("verdict") or "-")),
        )
        if reason or action:
            note = Text(f"{gpu_name(g)}: {hstate}: {reason or ''}", style=HEALTH_STYLE.get(hstate, ""))
            if action:
                note.append(f" -> What to do: {action}", style="bold")
            notes.append(note)
        others = uncounted_alerts(g, alerts)
        if others:
            notes.append(Text(f"{gpu_name(g)}: also firing, not counted in the GPU's health (about a job on it, or "
                              f"informational): {', '.join(others)}", style="yellow"))
    parts.append(Text(""))
    parts.append(t if gpus else Text("No GPUs.", style="dim"))
    parts.extend(notes)

    p = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("GPU", "PID", "USER", "PROCESS", "OWNER", "GPU MEMORY", "TREND", "LEAK"):
        # The owner (a pod, a container, a Slurm job: the page's Owner column) may be long: it wraps, the rest not.
        p.add_column(col, justify="right" if col in ("GPU MEMORY", "TREND", "PID") else "left",
                     no_wrap=col != "OWNER")
    more: list[Text] = []
    for g in gpus:
        for proc in g.get("processes") or []:
            if not isinstance(proc, dict):
                continue
            trend = proc.get("memory_trend") or {}
            leak = trend.get("leak")
            leak_text = Text(f"{leak.get('state')}: full in {fmt_duration(leak.get('eta_seconds'))}",
                             style="bold red" if leak.get("state") == "firing" else "yellow") if leak else Text("")
            p.add_row(Text(gpu_index(g)), Text(str(proc.get("pid"))), Text(str(proc.get("user") or "-")),
                      Text(str(proc.get("name") or "-")), Text(owner_text(proc.get("owner"))),
                      fmt_bytes(proc.get("used_memory_bytes")),
                      fmt_rate(trend.get("rate_bytes_per_second")), leak_text)
        extra = more_processes(g)
        if extra:
            more.append(Text(f"{gpu_name(g)}: {extra}", style="dim"))
    if p.row_count:
        parts += [Text(""), p, *more]

    for d in status.get("docks") or []:
        if isinstance(d, dict):
            line = Text(f"Dock {d.get('vendor') or ''} {d.get('name') or d.get('unique_id')} ({d.get('route')}): ")
            if d.get("authorized") is False:
                line.append("NOT authorized", style="bold red")
                if d.get("action"):  # the advice its GpuDockUnauthorized carries (rules/advice.py)
                    line.append(f" -> What to do: {d['action']}", style="bold")
            else:
                line.append(f"authorized, GPUs behind it: {len(d.get('gpus') or [])}")
            parts.append(line)

    a = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("ALERT", "STATE", "GPU", "SUMMARY"):
        a.add_column(col, no_wrap=col != "SUMMARY")
    order = {"firing": 0, "pending": 1, "silenced": 2, "inhibited": 2, "resolved": 3}
    shown = sorted(alerts, key=lambda x: order.get(alert_state(x), 4))
    for al in shown:
        labels = al.get("labels") or {}
        state = alert_state(al)
        a.add_row(Text(str(labels.get("alertname") or "-")), Text(state, style=STATE_STYLE.get(state, "")),
                  Text(str(labels.get("gpu") or labels.get("dock") or "-")),
                  Text(str((al.get("annotations") or {}).get("summary") or "")))
    parts.append(Text(""))
    parts.append(a if shown else Text("No alerts.", style="green"))
    parts.extend(Text(line) for line in alert_advice(shown))
    return Group(*parts)


async def _watch(base: str, interval: float, timeout: float, client: DaemonClient | None, *, console: Console,
                 live: bool) -> None:
    from rich.live import Live

    status: Mapping[str, Any] = {}
    alerts: Sequence[Mapping[str, Any]] = []
    last_ok: float | None = None
    view: Live | None = None
    try:
        while True:
            problem = None
            try:
                status, alerts = await fetch_status(base, timeout=timeout, client=client)  # --timeout
                last_ok = time.time()
            except DaemonRefused:
                raise
            except StatusUnavailable as e:
                problem = str(e)
            try:
                frame = render_view(status, alerts, interval=interval, now=time.time(), problem=problem,
                                    last_ok=last_ok)
            except RENDER_ERRORS as e:  # a value of a type no gpuwatchd sends, below what the shape check covers
                status, alerts = {}, []
                frame = render_view(status, alerts, interval=interval, now=time.time(), last_ok=last_ok,
                                    problem=not_gpuwatchd(base, "status", f"{type(e).__name__} while showing it"))
            if not live:
                console.rule(time.strftime("%Y-%m-%d %H:%M:%S"))
                console.print(frame)
                console.file.flush()
            elif view is None:
                view = Live(frame, console=console, auto_refresh=False, redirect_stdout=False,
                            redirect_stderr=False, vertical_overflow="ellipsis")
                view.start(refresh=True)
            else:
                view.update(frame, refresh=True)
            await asyncio.sleep(interval)
    finally:
        if view is not None:
            view.stop()


def run_watch(base: str, interval: float, timeout: float, client: DaemonClient | None = None) -> int:
    """Watch until Ctrl-C (exit 0). A daemon that refuses us (auth, TLS) ends it with the message (exit 3); a
    terminal that went away (EIO on a closed pseudo-terminal) ends it quietly. A closed pipe raises
    BrokenPipeError, which ``gpuwatchd``'s main turns into a quiet exit 141 like every command's."""
    from rich.console import Console

    from gpuwatchd.runtime.exitcodes import EXIT_BROKEN_PIPE, EXIT_OK, EXIT_UNREACHABLE

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich's own answer is SystemExit(1); every gpuwatchd command ends a closed pipe with 141.
            raise BrokenPipeError(errno.EPIPE, "the reader closed the pipe")

    console = PipeConsole()
    try:
        asyncio.run(_watch(base, max(interval, MIN_INTERVAL), timeout, client, console=console,
                           live=console.is_terminal))
    except KeyboardInterrupt:
        return EXIT_OK
    except DaemonRefused as e:
        print(f"gpuwatchd: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except OSError as e:
        if e.errno != errno.EIO:
            raise
        return EXIT_BROKEN_PIPE
    return EXIT_OK
