"""What training processes report of PyTorch's allocator, per (GPU uuid, pid): the latest report, and the last OOM.

Bounded: a report is kept only while its process is listed on its GPU (pruned at every snapshot) and never more
than ``MAX_REPORTS`` at once; the listener accepts reports only from processes NVML lists, so this holds at most
the processes the host runs.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuwatchd.model.training import TorchOom, TorchReport, TrainingSocketStatus

MAX_REPORTS = 4096  # 16 GPUs x 256 processes, the largest host issue 20 sized the daemon for


class TrainingLedger:
    """Latest allocator report and last OOM per (uuid, pid), and the socket's status."""

    def __init__(self) -> None:
        self.reports: dict[tuple[str, int], TorchReport] = {}
        self.last_oom: dict[tuple[str, int], TorchOom] = {}
        self.status: TrainingSocketStatus | None = None

    def report(self, ev: TorchReport) -> bool:
        key = (ev.uuid, ev.pid)
        if key not in self.reports and len(self.reports) >= MAX_REPORTS:
            return False
        self.reports[key] = ev
        if ev.oom is not None:
            self.last_oom[key] = ev.oom
        return True

    def set_status(self, ev: TrainingSocketStatus) -> bool:
        if ev == self.status:
            return False
        self.status = ev
        return True

    def prune(self, live: Iterable[tuple[str, int]]) -> bool:
        """Forget the processes no longer listed on their GPU; whether any was forgotten."""
        keep = set(live)
        gone = [k for k in self.reports if k not in keep]
        for k in gone:
            del self.reports[k]
            self.last_oom.pop(k, None)
        return bool(gone)
