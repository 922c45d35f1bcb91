"""``gpuwatchd.training``: PyTorch's allocator view of a training process, sent to the local gpuwatchd daemon.

One line in a training script, ``import gpuwatchd.training; gpuwatchd.training.watch()``, or none at all,
``python -m gpuwatchd.training train.py ARGS...``. Standard library only (torch is read from ``sys.modules``, never
imported here); a background thread every 10 s; never raises into the script; nothing happens when no daemon
listens. docs/training.md.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from gpuwatchd.training.input_wait import InputWaitMeter
from gpuwatchd.training.reporter import DEFAULT_INTERVAL_SECONDS, Reporter, default_socket

__all__ = ["Reporter", "stop", "watch", "wrap_input"]

T = TypeVar("T")
INTERVAL_ENV = "GPUWATCHD_TRAINING_INTERVAL"
DISABLE_ENV = "GPUWATCHD_TRAINING"  # "0": watch() does nothing (a job that must not talk to the daemon)



class _Process:
    """The one reporter of this process and the meter the data loader wrappers feed."""

    lock = threading.Lock()
    reporter: Reporter | None = None
    meter = InputWaitMeter()


def _interval(env: dict[str, str]) -> float:
    try:
        value = float(env.get(INTERVAL_ENV, ""))
    except ValueError:
        return DEFAULT_INTERVAL_SECONDS
    return value if 0.05 <= value <= 3600 else DEFAULT_INTERVAL_SECONDS


def watch(socket: str | Path | None = None, interval: float | None = None) -> Reporter | None:
    """Start reporting (once per process; later calls return the same reporter). None when disabled by
    ``GPUWATCHD_TRAINING=0``. ``socket`` defaults to ``$GPUWATCHD_TRAINING_SOCKET`` or the daemon's runtime
    directory; ``interval`` to ``$GPUWATCHD_TRAINING_INTERVAL`` or 10 s."""
    env = dict(os.environ)
    if env.get(DISABLE_ENV) == "0":
        return None
    with _Process.lock:
        if _Process.reporter is None:
            path = Path(socket) if socket is not None else default_socket(env)
            every = interval if interval is not None and interval > 0 else _interval(env)
            _Process.reporter = Reporter(path, every, _Process.meter)
            _Process.reporter.start()
        return _Process.reporter


def stop() -> None:
    """Stop reporting, after one last report."""
    with _Process.lock:
        reporter, _Process.reporter = _Process.reporter, None
    if reporter is not None:
        reporter.stop()


def wrap_input(iterable: Iterable[T]) -> Iterator[T]:
    """``for batch in wrap_input(loader):``: time each step's wait for its input, reported as
    ``gpuwatchd_process_torch_input_wait_ratio``."""
    return _Process.meter.wrap(iterable)
