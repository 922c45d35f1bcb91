"""`check-config` accepts only what `run` can honour: every numeric and duration key, at its boundaries.

The config models are walked (so a key added later is covered without touching this file); each numeric or duration
leaf gets 0, negative, tiny, huge, infinite and NaN values. Either the loader rejects the value with a message that
names the key (or its section, for checks across keys), or the value is finite and the parts that consume it run:
the history store takes hours of readings and every rule family evaluates without raising.
"""

from __future__ import annotations

import asyncio
import math
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from msgspec.structs import FieldInfo

from gpuwatchd.config.loader import Config, ConfigError, config_from_dict
from gpuwatchd.config.types import Section, dump, field_types
from gpuwatchd.model import GpuSample, ProcessSample, Snapshot, XidEvent
from gpuwatchd.notify.config import InhibitRuleConfig, ReceiverConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.store import Store

GIB = 1 << 30
MIB = 1 << 20
T0 = 1_700_000_000.0
UUID = "GPU-5a3c1b2e-0000-4000-8000-000000000000"
# The smallest valid item of a list of sections, so the keys inside it can be reached.
ITEM: dict[type[Section], dict[str, Any]] = {
    ReceiverConfig: {"name": "r", "type": "webhook", "url": "http://127.0.0.1:9/hook"},
    InhibitRuleConfig: {"source_matchers": ['alertname="GpuLost"']},
}
VALUES: tuple[Any, ...] = (0, -1, 1e-9, 0.5, 10**18, 2**63, 1e308, math.inf, -math.inf, math.nan, "0s", "1e-3ms")


@dataclass(frozen=True)
class Leaf:
    path: tuple[str | int, ...]
    key: str  # dotted, as in error messages


def _models(annotation: Any) -> Iterator[tuple[type[Section], bool]]:
    """Section models inside ``annotation`` (``X``, ``X | None``, ``tuple[X, ...]``); bool: it is a list item."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, Section):
        yield annotation, False
    elif origin in (tuple, list):
        for arg in typing.get_args(annotation):
            for model, _ in _models(arg):
                yield model, True
    elif origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            yield from _models(arg)


def _numeric(info: FieldInfo) -> bool:
    base, _, _ = field_types(info.type)
    return base in (int, float)


def leaves(model: type[Section], path: tuple[str | int, ...] = ()) -> Iterator[Leaf]:
    for info in msgspec.structs.fields(model):
        key = info.encode_name
        subs = list(_models(info.type))
        if subs:
            sub, is_item = subs[0]
            yield from leaves(sub, (*path, key, 0) if is_item else (*path, key))
        elif _numeric(info):
            full = (*path, key)
            yield Leaf(full, ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in full).replace(".[", "["))


def _document(leaf: Leaf, value: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    node: Any = doc
    model: type[Section] = Config
    for i, part in enumerate(leaf.path):
        last = i == len(leaf.path) - 1
        if isinstance(part, int):
            continue
        if last:
            node[part] = value
            break
        info = next(f for f in msgspec.structs.fields(model) if f.encode_name == part)
        sub, is_item = next(_models(info.type))
        if is_item:
            item = dict(ITEM.get(sub, {}))
            node[part] = [item]
            node = item
        else:
            node = node.setdefault(part, {})
        model = sub
    return doc


def _snapshot(t: float, k: int) -> Snapshot:
    used = 2 * GIB + k * 64 * MIB
    procs = (ProcessSample(pid=4242, used_memory_bytes=used - GIB, name="python", user="alice",
                           host_rss_bytes=4 * GIB + k * 32 * MIB),)  # fmt: skip
    g = GpuSample(
        uuid=UUID, index=0, name="NVIDIA A10G", pci_bus_id="00000000:0C:00.0", memory_total_bytes=24 * GIB,
        memory_used_bytes=used, memory_free_bytes=24 * GIB - used, utilization_gpu_ratio=0.95,
        temperature_celsius=92.0, temperature_slowdown_celsius=95.0, power_watts=150.0,
        clocks_event_reasons=0x40 if k % 2 else 0x20, pcie_link_generation=2, pcie_link_max_generation=4,
        pcie_link_width=8, pcie_link_max_width=16, pcie_replay_total=k * 500, processes=procs, processes_total=1,
    )  # fmt: skip
    xids = (XidEvent(uuid=UUID, xid=79, timestamp=t),) if k % 7 == 0 else ()
    return Snapshot(timestamp=t, nvml_ok=True, gpus=(g,), xid_events=xids)


def _exercise(cfg: Config) -> dict[str, str]:
    """3 h of readings every 2 min into the store, every family evaluated after each: the failures, by family."""
    store = Store(retention_seconds=cfg.history.retention, step_seconds=cfg.history.step)
    engine = RulesEngine(cfg.rules, host="node1")
    for k in range(90):
        t = T0 + k * 120.0
        store.apply(_snapshot(t, k))
        engine.evaluate(store, t)
    return {name: st.last_error or "" for name, st in engine.stats.items() if st.failures}


ALL = list(leaves(Config))


def test_the_walk_reaches_every_section() -> None:
    keys = {leaf.key for leaf in ALL}
    for expected in ("history.step", "nvml.poll_timeout", "rules.leak.bucket", "rules.throttle.window",
                     "notify.receivers[0].timeout", "notify.routes[0].group_wait", "notify.api.max_silences",
                     "processes.top_n", "rules.expected_gpu_count"):  # fmt: skip
        assert expected in keys, expected
    assert len(ALL) > 60


@pytest.mark.parametrize("leaf", ALL, ids=lambda leaf: leaf.key)
def test_every_value_is_refused_by_key_or_honoured(leaf: Leaf) -> None:
    section = leaf.key.rsplit(".", 1)[0] if "." in leaf.key else "(top level)"
    exercised: set[Any] = set()
    for value in VALUES:
        try:
            cfg = config_from_dict(_document(leaf, value))
        except ConfigError as e:
            assert e.problems, value
            for problem in e.problems:
                where = problem.split(":", 1)[0]
                assert where in (leaf.key, section) or leaf.key.startswith(where), (value, problem)
                assert "\n" not in problem
            continue
        accepted = _read(dump(cfg), leaf.path)
        if isinstance(accepted, float):
            assert math.isfinite(accepted), (value, accepted)
        if leaf.path[0] in ("rules", "history") and accepted not in exercised:
            exercised.add(accepted)
            assert _exercise(cfg) == {}, (leaf.key, value)


def _read(data: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


EXTREMES: dict[str, dict[str, Any]] = {
    # Every timer at the smallest value the loader takes.
    "smallest": {
        "nvml": {"poll_interval": "10ms", "poll_timeout": "50ms", "kill_grace": 0, "restart_backoff_initial": "1ms",
                 "restart_backoff_max": "1ms"},
        "history": {"step": "1ms", "retention": "86400ms"},
        "rules": {"resolved_retention": 0, "leak": {"interval": 0, "window": "4ms", "min_span": "4ms", "bucket": "1ms",
                                                    "for": 0, "urgent_min_hold": 0, "host_rss_for": 0},
                  "throttle": {"window": "1ms", "report_window": "1ms"}, "replays": {"window": "1ms"},
                  "xid": {"resolve_after": 0}},
        "notify": {"group_wait": 0, "group_interval": "1ms", "repeat_interval": "1ms", "alertmanager_resend": "1ms",
                   "max_retry_age": 0},
    },
    # ... and at the largest.
    "largest": {
        "nvml": {"poll_interval": "366d", "poll_timeout": "366d", "kill_grace": "366d",
                 "restart_backoff_initial": "366d", "restart_backoff_max": "366d"},
        "history": {"step": "366d", "retention": "366d"},
        "rules": {"resolved_retention": "366d", "leak": {"interval": "366d", "window": "366d", "min_span": "366d",
                                                         "bucket": "91d", "for": "366d", "horizon": "366d"},
                  "throttle": {"window": "366d", "report_window": "366d", "for": "366d"},
                  "replays": {"window": "366d"}, "xid": {"resolve_after": "366d"}},
        "notify": {"group_wait": "366d", "group_interval": "366d", "repeat_interval": "366d",
                   "alertmanager_resend": "366d", "max_retry_age": "366d", "retry_initial": "366d",
                   "retry_max": "366d"},
    },
}  # fmt: skip


@pytest.mark.timeout(600)  # a daemon start on a loaded 2-core machine; the test ends as soon as it has data
@pytest.mark.parametrize("extreme", sorted(EXTREMES))
async def test_the_daemon_runs_with_every_timer_at_its_bound(
    extreme: str, tmp_path: Path, standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path]
) -> None:
    from gpuwatchd.daemon import Daemon
    from gpuwatchd.sim.standin_abi import STATE_ENV
    from gpuwatchd.sim.state import make_state

    doc = {**EXTREMES[extreme], "listen": "127.0.0.1:0", "state_dir": str(tmp_path / "state"),
           "sysfs": {"root": str(tmp_path / "sysfs")}}  # fmt: skip
    doc["nvml"] = {**doc["nvml"], "library_path": str(standin_libdir)}
    cfg = config_from_dict(doc)
    daemon = Daemon(cfg, worker_env={STATE_ENV: str(write_sim_state(make_state(2)))})
    await daemon.start()
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + 60.0
        while daemon.store.latest is None or not daemon.store.latest.gpus:
            assert loop.time() < end, "no GPU data"
            assert daemon.failure is None, daemon.failure
            await asyncio.sleep(0.05)
        for _ in range(20):  # evaluations on the timer and after each snapshot, with these timings
            daemon.evaluate()
            await asyncio.sleep(0.05)
        assert daemon.failure is None, daemon.failure
        engine = daemon._engine
        assert engine is not None
        assert {f: s.last_error for f, s in engine.stats.items() if s.failures} == {}
    finally:
        await daemon.stop()
