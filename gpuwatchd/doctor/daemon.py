"""The daemon: its config valid, its state dir writable, one running and answering its status API, the last
NVML error it saw, and the alerts firing there (its view, from the same machine and over time, of what the checks
above looked at once: a replay rate, a leak, an Xid storm)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

from gpuwatchd.doctor.context import Host
from gpuwatchd.doctor.report import Result, fail, ok, warn
from gpuwatchd.runtime.status_client import DaemonRefused, StatusUnavailable, fetch_status

G = "daemon"


def fetch(host: Host) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str]:
    """The daemon's ``/api/v1/status`` and ``/api/v1/alerts``, or None, [] and why not."""
    try:
        status, alerts = asyncio.run(fetch_status(host.url.rstrip("/"), timeout=min(host.deadline, 5.0),
                                                  client=host.client))
    except DaemonRefused as e:
        return None, [], REFUSED + str(e)
    except StatusUnavailable as e:
        return None, [], str(e)
    return status, alerts, ""


# Firing alerts named in the detail line; the rest are counted (`gpuwatchd status` lists them all).
SHOWN_ALERTS = 5


# Prefix of ``why`` when a daemon answers but refused us (credentials, TLS): a failure with its own fix.
REFUSED = "refused: "


def check_daemon(host: Host, status: dict[str, Any] | None, why: str,
                 alerts: Sequence[dict[str, Any]] = ()) -> list[Result]:
    out: list[Result] = []
    where = str(host.config_path) if host.config_path else "built-in defaults"
    if host.config_error:
        out.append(fail(G, "config", f"{where}: {host.config_error}", f"fix it; `gpuwatchd check-config {where}`"))
    else:
        out.append(ok(G, "config", f"{where}: valid"))
    out.append(_state_dir(host))
    if status is None and why.startswith(REFUSED):
        out.append(fail(
            G, "running", why.removeprefix(REFUSED),
            "it runs but refused doctor: pass its CA with --ca-file and its credentials with --auth-user (password "
            "in $GPUWATCHD_PASSWORD or --auth-password-file), as for `gpuwatchd status` (docs/security.md)",
        ))  # fmt: skip
        return out
    if status is None:
        out.append(warn(
            G, "running", why, "start it: `sudo systemctl enable --now gpuwatchd`; `journalctl -u gpuwatchd` says "
            "why it stopped (or pass --url)",
        ))  # fmt: skip
        return out
    out.append(ok(G, "running", f"answering at {host.url}"))
    nvml = status.get("nvml") or {}
    if nvml.get("ok") is False:
        out.append(fail(
            G, "last NVML error", f"the daemon's NVML is down: {nvml.get('error')}",
            "see the driver lines above; the daemon retries by itself and recovers without a restart",
        ))  # fmt: skip
    elif nvml.get("stale"):
        out.append(warn(
            G, "last NVML error", "the daemon's last NVML poll missed its deadline (a GPU hangs)",
            "see `gpuwatchd status`; the hung GPU is set aside and retried; a reset or reboot clears a wedged GPU",
        ))  # fmt: skip
    else:
        out.append(ok(G, "last NVML error", "none"))
    out.append(firing_alerts(alerts))
    return out


def firing_alerts(alerts: Sequence[dict[str, Any]]) -> Result:
    """The daemon's firing alerts: a critical one fails, another warns, silenced ones are only named. The daemon
    judges over time what doctor sees once (a replay rate over minutes, a leak's trend), so "all passed" beside
    a firing alert would be false."""
    firing = [a for a in alerts if a.get("state") == "firing"]
    active = [a for a in firing if (a.get("status") or {}).get("state") != "suppressed"]
    muted = len(firing) - len(active)
    if not active:
        return ok(G, "firing alerts", "none" + (f" ({muted} silenced or inhibited)" if muted else ""))
    order = {"critical": 0, "warning": 1, "info": 2}
    active.sort(key=lambda a: order.get(str((a.get("labels") or {}).get("severity")), 3))
    shown = [_alert_line(a) for a in active[:SHOWN_ALERTS]]
    more = len(active) - len(shown)
    detail = (f"{len(active)} firing: " + "; ".join(shown) + (f"; and {more} more" if more else "")
              + (f" ({muted} more silenced or inhibited)" if muted else ""))
    first = active[0]
    what = str((first.get("annotations") or {}).get("description") or "")
    fix = (f"{(first.get('labels') or {}).get('alertname')}: {what} " if what else "") + (
        "`gpuwatchd status` (or the status page) shows each alert with what to do")
    critical = (first.get("labels") or {}).get("severity") == "critical"
    return (fail if critical else warn)(G, "firing alerts", detail, fix)


def _alert_line(a: dict[str, Any]) -> str:
    labels = a.get("labels") or {}
    summary = (a.get("annotations") or {}).get("summary")
    return f"{labels.get('alertname', '?')} ({labels.get('severity', '?')})" + (f": {summary}" if summary else "")


def _state_dir(host: Host) -> Result:
    d = host.config.state_dir
    probe = d if d.exists() else d.parent
    if os.access(probe, os.W_OK | os.X_OK):
        return ok(G, "state dir", f"{d} writable")
    return fail(
        G, "state dir", f"{d} is not writable by this user",
        f"create it for the service user: `sudo install -d -o {host.service_user} -m 0700 {d}` (the shipped unit's "
        "StateDirectory=gpuwatchd does this)",
    )  # fmt: skip
