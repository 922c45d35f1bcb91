"""Message text shared by the chat integrations: titles, per-alert lines, sparklines, truncation.

Everything here is pure (Notification in, text out) so each service's exact message is testable without I/O.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone

from gpuwatchd.model import OWNER_LABELS, Alert, ProcessOwner
from gpuwatchd.model.health import ADVICE as ACTION
from gpuwatchd.notify.notification import Notification

ELLIPSIS = "…"
SPARK_BARS = "▁▂▃▄▅▆▇█"
# Enough points to show a trend in one chat line; more only wraps on phones.
SPARKLINE_MAX_POINTS = 24
UUID_SHORT = 12  # "GPU-1a2b3c4d" — enough to tell GPUs of one host apart
_NUMBERS = re.compile(r"^\s*-?\d+(\.\d+)?([,\s]+-?\d+(\.\d+)?)*\s*$")


def truncate(text: str, limit: int) -> str:
    """At most ``limit`` characters (code points, not bytes); a cut text ends with ``…`` so readers see the cut."""
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    return text[: limit - 1] + ELLIPSIS


def sparkline(values: list[float], max_points: int = SPARKLINE_MAX_POINTS) -> str:
    """Values -> ``▁▂▄█`` bars scaled between their min and max (last ``max_points`` points)."""
    pts = [v for v in values if not math.isnan(v)][-max_points:]
    if not pts:
        return ""
    lo, hi = min(pts), max(pts)
    if hi == lo:
        return SPARK_BARS[0] * len(pts)
    top = len(SPARK_BARS) - 1
    return "".join(SPARK_BARS[round((v - lo) / (hi - lo) * top)] for v in pts)


def render_sparkline(annotation: str) -> str:
    """The ``sparkline`` annotation: numbers ("1,2,3") are drawn as bars; anything else is shown as given."""
    if _NUMBERS.match(annotation):
        return sparkline([float(x) for x in re.split(r"[,\s]+", annotation.strip())])
    return annotation.strip()


def gpu_line(alert: Alert) -> str:
    """``GPU 0 · NVIDIA A100 · GPU-1a2b3c4d`` from whatever GPU labels the alert has."""
    lab = alert.labels
    parts = []
    if lab.get("gpu"):
        parts.append(f"GPU {lab['gpu']}")
    if lab.get("model"):
        parts.append(lab["model"])
    if lab.get("uuid"):
        parts.append(lab["uuid"][:UUID_SHORT])
    if lab.get("pid"):
        proc = f" ({lab['process']})" if lab.get("process") else ""
        parts.append(f"pid {lab['pid']}{proc}")
    return " · ".join(parts)


def owner_line(alert: Alert) -> str:
    """``pod ml/trainer-0 container trainer`` (or ``container 3f2a9c1b7d4e``, ``job 4242``): who owns the process
    now, from the alert's annotations (the engine keeps them current; its labels are frozen when it fired, so an
    owner learnt later is only there: docs/alerts.md, "Identity"); "" for a host process or an unknown one."""
    facts = {k: alert.annotations.get(k) or alert.labels.get(k) for k in OWNER_LABELS}
    return ProcessOwner(**facts).describe().strip().removeprefix("in ")


def utc(ts: float | None) -> str:
    """``2026-11-21 23:13:29 UTC`` (empty for None)."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def title(n: Notification) -> str:
    """``[FIRING:2] GpuThrottled on host1`` (the count only when more than one alert), Alertmanager's style."""
    status = n.status.upper()
    count = len(n.firing) if n.status == "firing" else len(n.resolved)
    num = f":{count}" if count > 1 else ""
    name = n.common_labels.get("alertname") or ", ".join(sorted({a.name for a in n.alerts}))
    where = n.common_labels.get("host") or n.host
    gpu = ""
    if len({a.labels.get("uuid") for a in n.alerts}) == 1 and n.alerts[0].labels.get("uuid"):
        gpu = f" — {gpu_line(n.alerts[0])}"
    elif len({a.labels.get("unique_id") for a in n.alerts}) == 1 and n.alerts[0].labels.get("dock"):
        gpu = f" — {n.alerts[0].labels['dock']}"  # a Thunderbolt dock's alert (rules/dock.py)
    return f"[{status}{num}] {name} on {where}{gpu}"


def alert_text(alert: Alert, *, bold: str = "*", external_url: str = "") -> str:
    """The lines about one alert: state, summary (the numbers), GPU, trend, description, what to do, times, silence
    hint.

    ``bold`` is the service's bold marker: ``*`` for Slack mrkdwn, ``**`` for Markdown, ``""`` for plain text.
    With ``external_url`` (``notify.external_url``, where the user reaches this daemon) the silence hint is a link
    to the daemon's silence form for exactly this alert; without it, the API call to make.
    """
    b = bold
    resolved = alert.state == "resolved"
    head = f"{b}{'RESOLVED' if resolved else alert.severity.upper()}{b} {alert.name}: {alert.summary}"
    lines = [head]
    gpu = gpu_line(alert)
    if gpu:
        lines.append(f"GPU: {gpu}")
    owner = owner_line(alert)
    if owner:
        lines.append(f"Owner: {owner}")
    spark = alert.annotations.get("sparkline")
    if spark:
        lines.append(f"Trend: {render_sparkline(spark)}")
    if alert.description:
        lines.append(alert.description)
    todo = alert.annotations.get(ACTION)
    if todo:
        # The one advice every surface shows for this fault (rules/advice.py); the page and `status` show the same.
        lines.append(f"{b}What to do:{b} {todo}")
    since = utc(alert.fired_at if alert.fired_at is not None else alert.active_at)
    lines.append(f"Since: {since}" + (f" · resolved {utc(alert.resolved_at)}" if resolved else ""))
    if not resolved:
        if external_url:
            lines.append(f"Silence: {silence_link(alert, external_url)}")
        else:
            lines.append(f"Silence: POST /api/v1/silences with {silence_matchers(alert)}")
    return "\n".join(lines)


SILENCE_KEYS = ("alertname", "host", "uuid", "unique_id", "pid")
SILENCE_FORM_PATH = "/silences/new"


def silence_matchers(alert: Alert) -> str:
    """Matchers that would silence exactly this alert on this GPU (or Thunderbolt dock)."""
    keys = [k for k in SILENCE_KEYS if alert.labels.get(k)]
    return ", ".join(f'{k}="{alert.labels[k]}"' for k in keys)


def silence_link(alert: Alert, external_url: str) -> str:
    """``<external_url>/silences/new?alertname=...&uuid=...``: the daemon's silence form, filled in for this alert."""
    from urllib.parse import urlencode

    query = urlencode([(k, alert.labels[k]) for k in SILENCE_KEYS if alert.labels.get(k)])
    return f"{external_url.rstrip('/')}{SILENCE_FORM_PATH}?{query}"


def body_text(n: Notification, *, bold: str = "*") -> str:
    """All alerts of the notification, firing first, separated by blank lines."""
    return "\n\n".join(alert_text(a, bold=bold, external_url=n.external_url) for a in n.alerts)
