"""Escalation (pure): a GPU failure that comes back after the action it asked for was taken means that action did
not help, and the next message says what comes next, as gpud escalates an Xid to hardware inspection after
repeated reboots (leptonai/gpud ``components/accelerator/nvidia/xid/threshold.go``).

Whether the action was taken is read from the host, not assumed: a reboot changed the kernel's boot id
(``/proc/sys/kernel/random/boot_id``); a GPU reset made the GPU leave and come back (counted per boot), and a
reboot resets every GPU too. Level 1: drain the node and inspect the hardware; level 2 and up: replace the GPU.
An operator's acknowledgement (``gpuwatchd health ack``) clears the level and the history.
"""

from __future__ import annotations

from gpuwatchd.model.health import GpuHealth
from gpuwatchd.remediation.ledger import MAX_FAILURES_PER_GPU, Failure, GpuRecord

# Actions whose doing can be seen on the host; after restart_app or check_cable a recurrence says nothing new.
CHECKED_ACTIONS = ("reset_gpu", "reboot")
ACTION_WORDS = {"reset_gpu": "GPU reset", "reboot": "reboot", "inspect_hardware": "hardware inspection"}


def action_done(last: Failure, boot_id: str | None, resets: int) -> bool:
    """Whether the action ``last`` asked for has happened since (per the boot id and the GPU's resets)."""
    rebooted = boot_id is not None and last.boot_id is not None and boot_id != last.boot_id
    if last.action == "reboot":
        return rebooted
    if last.action == "reset_gpu":
        return rebooted or (boot_id == last.boot_id and resets > last.resets)
    return False


def on_failure(rec: GpuRecord, h: GpuHealth, boot_id: str | None, resets: int, now: float) -> bool:
    """Record a GPU entering an unhealthy state; True when this escalates it."""
    escalated = False
    if rec.failures:
        last = rec.failures[-1]
        if last.action in CHECKED_ACTIONS and action_done(last, boot_id, resets):
            rec.escalation += 1
            rec.escalated_at = now
            rec.escalated_after = last.action
            escalated = True
    rec.failures.append(Failure(now, h.action, h.reason, boot_id, resets))
    del rec.failures[:-MAX_FAILURES_PER_GPU]
    return escalated


def next_steps(level: int) -> str:
    """What comes next at an escalation level, in words."""
    if level <= 1:
        return ("drain the node and inspect the GPU (reseat it; check its power cables, slot, riser and cooling); "
                "then `gpuwatchd health ack GPU --comment ...`. If it fails again after that, replace the GPU")
    return ("replace the GPU (open a hardware case with its serial and this history); then `gpuwatchd health ack "
            "GPU --replaced`")


def summary(name: str, rec: GpuRecord) -> str:
    did = ACTION_WORDS.get(rec.escalated_after or "", rec.escalated_after or "the action")
    times = f" ({rec.escalation} times)" if rec.escalation > 1 else ""
    return f"{name} failed again after a {did}: the {did} did not help{times}"
