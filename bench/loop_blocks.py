"""How long the daemon's per-poll work blocks its event loop: instrumentation for ``bench/gc_tail.py --blocks``.

Loaded into the daemon under test (any checkout: what a tree does not have is skipped) before it starts. It writes
one stderr line per measurement, which the bench reads back for the measuring window only:

- ``blk <monotonic> <ms> <cpu ms> <what>``: an event-loop callback (a task step, a reader callback, a timer) that
  ran for at least ``BLOCK_MS``; ``what`` is the task's coroutine or the callback. The wall time is the wait a scrape
  arriving then has before its handler can even start; the loop thread's CPU time within it tells its own work from
  waiting for the GIL (another thread of the daemon: the sim's scenario player, a history save) or for a core.
- ``tm <monotonic> <step> <ms> <cpu ms>``: one call of a per-poll step (decoding the worker's line, ``Store.apply``, the
  rules, attribution, the cache key, collecting the families, gzip...), every call. Steps nest (``on_snapshot``
  holds ``store.apply``), and ``collect.*`` steps run inside a render; the CPU time is the calling thread's.
- ``collect<gen> <monotonic> <ms> <found>``: a collection of that generation and the unreachable objects it
  freed (the bench counts full ones from its own ``gc2`` lines).

Wall times carry the machine's load (and other threads holding the GIL); the CPU times much less. Compare one tree
against another on the same machine at the same time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import importlib
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

BLOCK_MS = 1.0

_write = sys.stderr.write
_now = time.monotonic
_perf = time.perf_counter
_cpu = time.thread_time


def _emit(line: str) -> None:
    with contextlib.suppress(Exception):  # a closed stderr at shutdown must not break the daemon
        _write(line)


def _describe(handle: Any) -> str:
    cb = handle._callback
    task = getattr(cb, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        return f"task:{getattr(coro, '__qualname__', type(coro).__name__)}"
    inner = getattr(cb, "func", cb)  # functools.partial
    return f"cb:{getattr(inner, '__qualname__', type(inner).__name__)}".replace(" ", "_")


def _patch_handles() -> None:
    run = asyncio.events.Handle._run

    def timed_run(self: Any) -> None:
        t0, c0 = _perf(), _cpu()
        run(self)
        ms = (_perf() - t0) * 1000
        if ms >= BLOCK_MS:
            _emit(f"blk {_now():.3f} {ms:.2f} {(_cpu() - c0) * 1000:.2f} {_describe(self)}\n")

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]


def _wrap(module: str, path: str, label: str, generator: bool = False) -> None:
    """Time every call of ``module.path`` (``Class.method`` or ``function``); silently skipped when absent."""
    try:
        owner: Any = importlib.import_module(module)
    except ImportError:
        return
    *parents, name = path.split(".")
    for p in parents:
        owner = getattr(owner, p, None)
        if owner is None:
            return
    fn: Callable[..., Any] | None = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if fn is None:
        return

    if generator:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Iterable[Any]:
            t0, c0 = _perf(), _cpu()
            items = list(fn(*args, **kwargs))
            _emit(f"tm {_now():.3f} {label} {(_perf() - t0) * 1000:.2f} {(_cpu() - c0) * 1000:.2f}\n")
            return iter(items)
    else:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = _perf(), _cpu()
            try:
                return fn(*args, **kwargs)
            finally:
                _emit(f"tm {_now():.3f} {label} {(_perf() - t0) * 1000:.2f} {(_cpu() - c0) * 1000:.2f}\n")

    setattr(owner, name, timed)


def _gc_hook() -> None:
    started = [0.0, 0.0, 0.0]

    def hook(phase: str, info: dict[str, int]) -> None:
        gen = info["generation"]
        if phase == "start":
            started[gen] = _perf()
        else:
            _emit(f"collect{gen} {_now():.3f} {(_perf() - started[gen]) * 1000:.2f} {info.get('collected', 0)}\n")

    gc.callbacks.append(hook)


STEPS = [
    ("gpuwatchd.sources.nvml.supervisor", "json.loads", "json.loads"),
    ("gpuwatchd.sources.nvml.intake", "SnapshotIntake.receive", "decode"),
    ("gpuwatchd.daemon.data_path", "DataPath._on_snapshot", "on_snapshot"),
    ("gpuwatchd.store", "Store.apply", "store.apply"),
    ("gpuwatchd.sources.attribution.task", "AttributionTask.resolve", "attribution"),
    ("gpuwatchd.store.history_file", "HistoryFile.on_snapshot", "history.on_snapshot"),
    ("gpuwatchd.daemon.evaluation", "Evaluation.evaluate", "evaluate"),
    ("gpuwatchd.rules.engine", "RulesEngine.evaluate", "rules"),
    ("gpuwatchd.daemon.evaluation", "update_health", "health"),
    ("gpuwatchd.notify.dispatcher", "Dispatcher.update", "dispatcher"),
    ("gpuwatchd.daemon.http", "HttpWiring._metrics_cache_key", "cache_key"),
    ("gpuwatchd.exporter.collector", "StoreCollector.collect", "collect.store", True),
    ("gpuwatchd.rules.metrics", "AlertsCollector.collect", "collect.alerts", True),
    ("gpuwatchd.exporter.encode", "_family_text", "encode.family"),
    ("gpuwatchd.web.http", "gzip.compress", "gzip"),
    ("gpuwatchd.runtime.gc_tuning", "freeze_survivors", "freeze"),
    ("gpuwatchd.sim.player", "Player.step", "sim.player"),
]


def install() -> None:
    _patch_handles()
    _gc_hook()
    for module, path, label, *gen in STEPS:  # type: ignore[misc]
        _wrap(module, path, label, bool(gen))
