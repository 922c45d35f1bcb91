"""The daemon's evaluation loop: rules after every snapshot and on a timer, the GPUs' health state, the alerts to
the dispatcher, the status line to systemd when it changed."""

from __future__ import annotations

from gpuwatchd.daemon.health_view import update_health
from gpuwatchd.daemon.status import StatusViews
from gpuwatchd.model import Alert
from gpuwatchd.runtime.waits import wait_event

# Rules also run on this timer (clock seconds) when no snapshot arrives, so a hung worker still raises alerts.
MIN_EVAL_INTERVAL = 1.0
# Clock seconds the timer waits beyond the interval after an evaluation that a snapshot (or another event) woke: the
# next snapshot is due one poll interval later and arrives a few milliseconds either side of it, so a timer of
# exactly the interval fired just before it about one poll in six (1 s polling), an evaluation that saw nothing new
# (docs/performance.md, "8x32"). Once no snapshot comes, the timer runs every interval again: the first timer
# evaluation of a silence is this much later, no state change waits for it (a stale worker wakes the rules itself).
SNAPSHOT_GRACE = 0.1


class Evaluation(StatusViews):
    async def _evaluate_loop(self) -> None:
        assert self._wakeup is not None
        woken = False
        while True:
            interval = max(MIN_EVAL_INTERVAL, self.config.nvml.poll_interval)
            if woken:
                interval += SNAPSHOT_GRACE
            # wait_event, not asyncio.wait_for: on Python < 3.12 wait_for swallows a cancel that races with the
            # event being set (cpython#86296), and snapshots set it ten times a second in tests.
            woken = await wait_event(self._wakeup, interval / self.clock.speed)
            self._wakeup.clear()
            self.evaluate()

    def evaluate(self) -> list[Alert]:
        """Run the rules on the store now and hand the result to the dispatcher."""
        if self._engine is None or self._dispatcher is None:
            raise RuntimeError("daemon not started")
        now = self.clock.now()
        self.alerts = list(self._engine.evaluate(self.store, now))
        update_health(self.store, self.alerts, now)
        if self.remediation is not None:
            self.remediation.wake()  # it reads the new health; its own notifications go with the rules' alerts
            self.alerts.extend(self.remediation.alerts())
        self._generation += 1
        self._dispatcher.update(self.alerts)
        status = self._status_line()
        if status != self._last_status:
            self._last_status = status
            self.sd.status(status)
        return self.alerts
