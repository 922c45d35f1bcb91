"""The decisions of remediation as pure functions: which GPUs take the node out of service, the drain's reason,
and what to do next given what gpuwatchd holds (no I/O; history and ``now`` in, decision out)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from gpuwatchd.model.health import GpuHealth
from gpuwatchd.remediation.config import MAX_REASON_CHARS
from gpuwatchd.remediation.ledger import Drain

REASON_PREFIX = "gpuwatchd:"

Step = Literal["none", "drain", "resume", "wait_resume", "rate_limited"]


def out_of_service(health: Mapping[str, GpuHealth], actions: Iterable[str]) -> dict[str, GpuHealth]:
    """The GPUs whose health takes them out of service: unhealthy, with one of ``actions`` to do."""
    wanted = set(actions)
    return {u: h for u, h in sorted(health.items()) if h.state == "unhealthy" and h.action in wanted}


def _clean(text: str) -> str:
    # One line of printable text: Slurm shows it in `sinfo -R`; brackets would look like its "[user@time]" suffix.
    out = "".join(c if c.isprintable() else " " for c in text).replace("[", "(").replace("]", ")")
    return " ".join(out.split())


def drain_reason(bad: Mapping[str, GpuHealth], names: Mapping[str, str]) -> str:
    """``gpuwatchd: GPU 0 (GPU-3a1e...) unhealthy, reboot: <reason>; evidence GpuLost`` (and ``+N more GPUs``), at
    most ``MAX_REASON_CHARS``: which GPU, the evidence, and who set it."""
    uuid, h = next(iter(bad.items()))
    name = names.get(uuid, "GPU")
    evidence = ",".join(h.evidence) or "health"
    more = f"; +{len(bad) - 1} more GPU{'s' * (len(bad) > 2)}" if len(bad) > 1 else ""
    head = f"{REASON_PREFIX} {name} ({uuid}) {h.state}, {h.action}: "
    tail = f"; evidence {evidence}{more}"
    room = MAX_REASON_CHARS - len(head) - len(tail)
    text = _clean(h.reason)
    if len(text) > room:
        text = text[: max(0, room - 3)] + "..."
    return _clean(head + text + tail)[:MAX_REASON_CHARS]


def next_step(
    bad: Mapping[str, GpuHealth],
    health: Mapping[str, GpuHealth],
    held: Drain | None,
    good_since: float | None,
    last_action_at: float | None,
    *,
    now: float,
    resume_after: float,
    min_interval: float,
) -> Step:
    """What to do about the node now.

    Drain when a GPU is out of service and gpuwatchd holds no drain; resume a drain it holds once every GPU it
    named is healthy again and no GPU is out of service, for ``resume_after``; at most one action per
    ``min_interval``.
    """
    if bad and held is None:
        step: Step = "drain"
    elif not bad and held is not None:
        if not all(health.get(u) is not None and health[u].state == "healthy" for u in held.gpus):
            return "wait_resume"
        if good_since is None or now - good_since < resume_after:
            return "wait_resume"
        step = "resume"
    else:
        return "none"
    if last_action_at is not None and now - last_action_at < min_interval:
        return "rate_limited"
    return step
