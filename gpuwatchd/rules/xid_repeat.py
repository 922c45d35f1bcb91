"""``GpuXidRepeated`` and ``GpuXidSupportCase``: what the Xid history says that one Xid does not.

An application Xid (13, 31, 43) once is the job's bug: GpuXidError says "restart the application". The same code
in several *jobs* on one GPU, while the host's other GPUs run the same kind of work without it, follows the GPU,
not the code (NVIDIA's catalog, WORKFLOW_XID_13/31: "repeat ... to same GPU: run diagnostics; to different GPUs:
check the application"). A fatal Xid (one whose immediate action is a GPU reset or a reboot) that comes back within
a day after that recovery means the recovery does not hold: a support case (NVIDIA's investigatory action for them
is CONTACT_SUPPORT when they recur; NVSentinel escalates a fatal Xid seen 5 times in 24 h the same way).

Jobs and episodes: the kernel log names the process (``pid=811977``); events of one pid are one job. Without a
pid (NVML events, ``pid='<unknown>'``), events of one code closer than ``burst_gap`` are one job: a job that hits
an MMU fault logs a burst of them. A fault's burst of fatal Xids (48 with 63 and a string of 94s within a second)
is one episode. Thresholds in ``rules.xid_repeat`` (docs/alerts.md, "Xid repetition"). Both resolve when the
window no longer holds enough: the history is the evidence, and it ages out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpuwatchd.model import XidEvent
from gpuwatchd.rules.condition import Condition, RuleView, fmt_duration, gpu_labels, gpu_title
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.xid import describe, gpu_resolver, severity

REPEATED = "GpuXidRepeated"
SUPPORT_CASE = "GpuXidSupportCase"
_PID = re.compile(r"\bpid=(\d+)")


def _jobs(events: list[XidEvent], burst_gap: float) -> int:
    """Distinct jobs among one code's events on one GPU (oldest first): pids where known, else bursts."""
    pids: set[str] = set()
    bursts = 0
    last: float | None = None
    for ev in events:
        m = _PID.search(ev.message or "")
        if m is not None:
            pids.add(m.group(1))
            continue
        if last is None or ev.timestamp - last > burst_gap:
            bursts += 1
        last = ev.timestamp
    return len(pids) + bursts


def _episodes(events: Iterable[XidEvent], burst_gap: float) -> list[list[XidEvent]]:
    out: list[list[XidEvent]] = []
    for ev in events:
        if out and ev.timestamp - out[-1][-1].timestamp <= burst_gap:
            out[-1].append(ev)
        else:
            out.append([ev])
    return out


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    cfg = config.xid_repeat
    by_gpu: dict[str, list[XidEvent]] = {}
    recent = [ev for ev in view.recent_xids
              if ev.xid not in config.xid.ignore and now - cfg.window < ev.timestamp <= now]
    uuid_of = gpu_resolver(view, recent)  # GPUs no one lists, past a few, are no GPU to judge
    for ev in recent:
        uuid = uuid_of(ev)
        if uuid is not None:
            by_gpu.setdefault(uuid, []).append(ev)
    for events in by_gpu.values():
        events.sort(key=lambda e: e.timestamp)
    window = fmt_duration(cfg.window)
    out: list[Condition] = []
    jobs = {(uuid, code): _jobs([e for e in events if e.xid == code], cfg.burst_gap)
            for uuid, events in by_gpu.items() for code in cfg.app_codes}
    for (uuid, code), n in sorted(jobs.items()):
        others = max((m for (u, c), m in jobs.items() if c == code and u != uuid), default=0)
        if n < cfg.min_jobs or others >= n:
            continue  # once is the job's bug; as often on another GPU, it follows the application
        labels = {**gpu_labels(view, uuid), "xid": str(code)}
        meaning, _ = describe(code)
        elsewhere = "no other GPU of this host had it" if others == 0 else f"no other GPU had it in more than {others}"
        out.append(Condition(
            REPEATED, "warning", labels,
            f"{gpu_title(labels)}: Xid {code} ({meaning}) in {n} different jobs in the last {window}; "
            f"{elsewhere}: it follows this GPU, not one application",
            "One application Xid is the job's bug; the same code across jobs on one GPU points at the GPU. "
            f"Resolves when fewer than {cfg.min_jobs} jobs in {window} hit it.",
            value=float(n),
        ))
    for uuid, events in sorted(by_gpu.items()):
        fatal = [e for e in events if severity(e.xid) == "critical"]
        episodes = _episodes(fatal, cfg.burst_gap)
        if len(episodes) < cfg.fatal_count:
            continue
        labels = gpu_labels(view, uuid)
        codes = ", ".join(sorted({str(e.xid) for ep in episodes for e in ep}, key=int))
        out.append(Condition(
            SUPPORT_CASE, "critical", labels,
            f"{gpu_title(labels)}: {len(episodes)} fatal Xid episodes in the last {window} (Xid {codes}); "
            f"the resets or reboots are not holding",
            "Resets or reboots did not hold: the GPU keeps failing the same way. Resolves when "
            f"fewer than {cfg.fatal_count} episodes in {window} remain.",
            value=float(len(episodes)),
            annotations={"xids": codes, "first_seen": f"{episodes[0][0].timestamp:.3f}"},
        ))
    return out
