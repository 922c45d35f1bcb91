"""Helpers of the integration tests: the daemon as a `gpuwatchd run` process, and reading it over HTTP."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
WAIT_SECONDS = 30.0  # upper bound for conditions on a loaded 2-core box; each test returns as soon as they hold
# Upper bound for a daemon or sim process to start serving: a fresh interpreter, its imports, the stand-in driver's
# build and the first NVML poll, beside the other test workers and whatever else shares the machine (CI saw a sim
# take over 30 s to answer /healthz next to heavy jobs). A liveness bound: each wait returns as soon as it serves.
START_SECONDS = 120.0
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_metrics(text: str) -> Samples:
    return {
        (smp.name, tuple(sorted(smp.labels.items()))): smp.value
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    for (n, lab), v in samples.items():
        if n == name and want <= set(lab):
            return v
    return None


def labels_of(samples: Samples, name: str, **labels: str) -> list[dict[str, str]]:
    want = set(labels.items())
    return [dict(lab) for (n, lab) in samples if n == name and want <= set(lab)]


def wait_until(cond: Callable[[], Any], what: str, timeout: float = WAIT_SECONDS) -> Any:
    end = time.monotonic() + timeout
    while True:
        result = cond()
        if result:
            return result
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class DaemonProcess:
    """A `gpuwatchd run` child process; its stderr goes to ``log_path``."""

    proc: subprocess.Popen[bytes]
    url: str
    config_path: Path
    log_path: Path

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=timeout) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:  # 4xx/5xx still carry a body worth asserting on
            return e.code, e.read().decode()

    def metrics(self) -> Samples:
        status, text = self.get("/metrics")
        assert status == 200
        return parse_metrics(text)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def metrics_when(d: DaemonProcess, pred: Callable[[Samples], bool], what: str) -> Samples:
    """Scrape until ``pred`` holds for a scrape; return that scrape."""

    def check() -> Samples | None:
        m = d.metrics()
        return m if pred(m) else None

    result: Samples = wait_until(check, what)
    return result
