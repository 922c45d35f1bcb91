"""Exact chat messages per stand-in scenario (issue #4 item 6), replayed deterministically.

Each scenario runs through the real NVML worker, store, rules engine and dispatcher on a ManualClock
(``scenario_replay``), and every service's sink gets exactly the messages in ``golden/<scenario>/<service>.json``
(fired and resolved, nothing more); the benign scenarios send nothing. ``UPDATE_GOLDEN=1`` rewrites the files;
read the diff (``golden/<scenario>/slack.md`` shows the Slack text as a reader sees it) before committing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .scenario_harness import SERVICES, check_chat_text, check_unplug, message_text, summary
from .scenario_replay import NvmlChild, replay

GOLDEN = Path(__file__).with_name("golden")
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
TAIL_S = 60.0  # past the end: resolutions and the last group_interval (30 s) go out
# Scenario -> (alerts it is about, exactly; poll/evaluation step in scenario seconds). 5 s is the store's history
# step; the leak's half hour is sampled every 10 s to keep the run short (the leak window is many minutes).
SCENARIOS: dict[str, tuple[set[str], float]] = {
    "leak": ({"GpuMemoryLeak"}, 10.0),
    "plateau": (set(), 5.0),
    "throttle-thermal": ({"GpuThrottled", "GpuTemperatureHigh"}, 5.0),
    "power-brake": ({"GpuThrottled"}, 5.0),
    "sw-power-cap-idle": (set(), 5.0),
    # One pull of the cable, one incident: the dock leaves the Thunderbolt bus with the GPU, so GpuRemoved speaks
    # ("re-plug the dock"); the Xid 79 (held until the loss is known) and the loss itself are folded into it
    # (docs/alerts.md). The user reads: detached, back.
    "egpu-unplug": ({"GpuRemoved"}, 1.0),
    "xid-storm": ({"GpuXidError", "GpuEccError", "GpuLost"}, 1.0),  # Xid 48 is a DBE, Xid 79 the loss
    "ecc": ({"GpuEccError", "GpuXidError"}, 1.0),
    "link-degraded": ({"GpuPcieLinkDegraded", "GpuPcieReplays"}, 5.0),
    # Torch health probes (run on the CPU device as under `gpuwatchd sim`; a probe run takes real seconds).
    "probe-sdc": ({"GpuProbeFailed"}, 10.0),
    "egpu-slow-link": ({"GpuPerformanceDegraded"}, 10.0),
    "probe-hang": ({"GpuProbeFailed"}, 10.0),
    "dock-unauthorized": ({"GpuDockUnauthorized"}, 5.0),
    "tb-link-degraded": ({"GpuDockLinkDegraded"}, 5.0),
    "nvlink-errors": ({"GpuNvlinkErrors"}, 5.0),
    "recovery-action": ({"GpuRecoveryActionRequired"}, 5.0),
}
# A marginal cable replaced at 300 s: the replays' firing message names the link and the dock; the resolution, ~2 min
# after the last replay under load (issue 28 §5), states the rate then. The tail covers that resolution.
SCENARIOS["egpu-flaky-cable"] = ({"GpuPcieReplays"}, 5.0)
TAILS = {"egpu-flaky-cable": 240.0}
SCENARIOS["underutilized"] = ({"GpuUnderutilized"}, 10.0)  # with rules.underutilized.enabled (SCENARIO_RULES)
SCENARIOS["mig"] = ({"GpuMemoryLeak"}, 10.0)  # the 1g.10gb MIG device's leak, named by its MIG uuid

PROBE_SCENARIOS = {"probe-sdc", "egpu-slow-link", "probe-hang"}


@pytest.fixture(scope="module")
def child() -> Iterator[NvmlChild]:
    from gpuwatchd.sim.build import build_standin

    c = NvmlChild(build_standin())
    yield c
    c.close()


def _golden(name: str, service: str, got: list[Any]) -> None:
    path = GOLDEN / name / f"{service}.json"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    assert path.exists(), f"no golden file {path}: run with UPDATE_GOLDEN=1 and review it"
    want = json.loads(path.read_text(encoding="utf-8"))
    assert got == want, f"{service} messages of {name} differ from {path} (UPDATE_GOLDEN=1 rewrites it)"


def _readable(name: str, slack: list[Any]) -> None:
    """``golden/<scenario>/messages.txt``: the Slack messages as a reader sees them, to review by eye."""
    text = "\n\n========\n\n".join(message_text(b, "slack") for b in slack) + "\n"
    path = GOLDEN / name / "messages.txt"
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert path.read_text(encoding="utf-8") == text


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_exact_messages(name: str, child: NvmlChild, tmp_path: Path) -> None:
    expected, step = SCENARIOS[name]
    run = await replay(name, child, tmp_path, step=step, tail=TAILS.get(name, TAIL_S), probes=name in PROBE_SCENARIOS)
    got = {s: run.sinks[s].bodies() for s in SERVICES}
    if not expected:
        assert got == {s: [] for s in SERVICES}
        assert not (GOLDEN / name).exists(), "a benign scenario has no messages to keep"
        return
    hooks = got["webhook"]
    assert {a["labels"]["alertname"] for h in hooks for a in h["alerts"]} == expected
    want = [summary(h, "webhook") for h in hooks]
    for s in SERVICES:
        assert [summary(b, s) for b in got[s]] == want, f"{s} says something else than the webhook"
        _golden(name, s, got[s])
    check_chat_text(run.sinks)
    _readable(name, got["slack"])
    if name == "egpu-unplug":
        check_unplug(hooks)
        assert run.workers == 4  # NVML sessions: the first, after the loss, after the removal, after the replug


async def test_underutilized_is_off_by_default(child: NvmlChild, tmp_path: Path) -> None:
    # The same run with the default rules config: the idle-but-held GPU is nobody's business by default.
    run = await replay("underutilized", child, tmp_path, step=30.0, tail=TAIL_S, rules={})
    assert {s: run.sinks[s].bodies() for s in SERVICES} == {s: [] for s in SERVICES}
