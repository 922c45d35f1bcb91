"""``GpuNvlinkErrors``: NVLink error counters rising on one link of one GPU, one alert per (GPU, link).

Thresholds are DCGM's NVLINK health watch (``modules/health/DcgmHealthWatch.cpp``, over the last minute): any
replay or recovery error -> FAIL (critical); CRC errors (flit + data) at or above 100/s -> FAIL (critical); any CRC
error below that -> WARN (warning). Counts come from the store's history of the per-link counters
(``nvml_nvlink.py``); a counter that went backwards (driver reload, GPU reset) counts from zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuwatchd.model import Severity
from gpuwatchd.rules.condition import Condition, RuleView, fmt_duration, gpu_labels, gpu_title
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.store import GpuPoint

NAME = "GpuNvlinkErrors"
KINDS = ("crc_flit", "crc_data", "replay", "recovery")
_SEVERITIES: tuple[Severity, ...] = ("warning", "critical")
_WORDS = {"crc_flit": "CRC flit", "crc_data": "CRC data", "replay": "replay", "recovery": "recovery"}

DESCRIPTION = (
    "The NVLink between this GPU and its peer (or NVSwitch) is retransmitting or retraining: a marginal link "
    "(connector, cable or bridge, NVSwitch tray, heat). Replays and recoveries cost bandwidth and precede link "
    "failure (Xid 74)."
)


def _deltas(points: Sequence[GpuPoint], link: str) -> dict[str, int]:
    """Errors per kind between the first and the last point of ``points`` on ``link``."""
    first: Mapping[str, int] = {}
    for p in points:
        if p.nvlink_errors_total is not None and link in p.nvlink_errors_total:
            first = p.nvlink_errors_total[link]
            break
    last = points[-1].nvlink_errors_total
    now = last.get(link, {}) if last is not None else {}
    out: dict[str, int] = {}
    for kind in KINDS:
        if kind not in now:
            continue
        before = first.get(kind, now[kind])
        out[kind] = now[kind] - before if now[kind] >= before else now[kind]  # reset: count from zero
    return out


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """One condition per (GPU, link) whose error counters rose within the window."""
    snap = view.latest
    if snap is None:
        return []
    cfg = config.nvlink
    out: list[Condition] = []
    for g in snap.gpus:
        if not g.nvlink_errors_total:
            continue
        history = [p for p in view.gpu_history(g.uuid) if p.nvlink_errors_total is not None and p.t <= now]
        window = [p for p in history if now - cfg.window <= p.t]
        if len(window) < 2:
            continue
        span = window[-1].t - window[0].t
        if span <= 0:
            continue
        base = gpu_labels(view, g.uuid)
        for link in sorted(g.nvlink_errors_total, key=int):
            d = _deltas(window, link)
            crc = d.get("crc_flit", 0) + d.get("crc_data", 0)
            retrain = d.get("replay", 0) + d.get("recovery", 0)
            if crc <= 0 and retrain <= 0:
                if not any(_deltas(history, link).values()):
                    continue  # quiet for the whole history: no alert of this link can be resolving
                # the message of a resolution, for either severity the link's alert had
                totals = g.nvlink_errors_total[link]
                quiet = (f"{gpu_title(base)}: NVLink {link}: no new errors in the last {fmt_duration(span)} ("
                         + ", ".join(f"{_WORDS[k]} {totals[k]}" for k in KINDS if k in totals) + " in all)")
                for sev in _SEVERITIES:
                    out.append(Condition(NAME, sev, {**base, "link": link}, quiet, DESCRIPTION.replace(
                        "<index>", base.get("gpu") or "<index>"), level="clear"))
                continue
            rate = crc / span
            severity: Severity = "critical" if retrain > 0 or rate >= cfg.crc_critical_per_second else "warning"
            parts = [f"{n} {_WORDS[k]}" for k, n in d.items() if n > 0]
            why = ("replay/recovery errors fail DCGM's NVLink health check" if retrain > 0
                   else f"DCGM fails a link at {cfg.crc_critical_per_second:g} CRC errors/s" if severity == "critical"
                   else f"DCGM warns at any CRC error and fails at {cfg.crc_critical_per_second:g}/s")
            out.append(Condition(
                NAME, severity, {**base, "link": link},
                f"{gpu_title(base)}: NVLink {link}: {', '.join(parts)} errors in the last {fmt_duration(span)} "
                f"({rate:.1f} CRC errors/s; {why})",
                DESCRIPTION.replace("<index>", base.get("gpu") or "<index>"),
                value=float(crc + retrain),
            ))
    return out
