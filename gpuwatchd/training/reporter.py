"""The background thread that sends the allocator's counters to the daemon every interval.

It never raises into the training script: a missing daemon, a refused connection, a torch that changed its API all
end in "nothing sent this time" (counted in the next message's ``client_errors``), and the thread is a daemon
thread, so it never holds the interpreter at exit. torch is taken from ``sys.modules``: the client never imports
it (a script that does not use torch pays nothing, and no CUDA context is ever created by us).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuwatchd.training import stats, wire
from gpuwatchd.training.input_wait import InputWaitMeter

DEFAULT_INTERVAL_SECONDS = 10.0  # the daemon polls NVML every few seconds; a finer allocator view buys nothing
SEND_TIMEOUT_SECONDS = 2.0  # a daemon that stops reading must not hold this thread (it is not the training loop)


def default_socket(env: dict[str, str] | None = None) -> Path:
    """``$GPUWATCHD_TRAINING_SOCKET``, else the first of /run/gpuwatchd and ``$XDG_RUNTIME_DIR/gpuwatchd`` that
    exists (the daemon's choices, in its order), else /run/gpuwatchd/training.sock."""
    env = dict(os.environ) if env is None else env
    explicit = env.get(wire.SOCKET_ENV)
    if explicit:
        return Path(explicit)
    dirs = [Path(d) for d in wire.DEFAULT_SOCKET_DIRS]
    if env.get("XDG_RUNTIME_DIR"):
        dirs.append(Path(env["XDG_RUNTIME_DIR"]) / "gpuwatchd")
    for d in dirs:
        if (d / wire.SOCKET_NAME).exists():
            return d / wire.SOCKET_NAME
    return dirs[0] / wire.SOCKET_NAME


class Reporter:
    """Reads the allocator every ``interval`` seconds on its own thread and sends one line to ``path``."""

    def __init__(self, path: Path, interval: float = DEFAULT_INTERVAL_SECONDS,
                 meter: InputWaitMeter | None = None) -> None:
        self.path = path
        self.interval = interval
        self.meter = meter or InputWaitMeter()
        self.sent = 0
        self.errors = 0
        self._sock: socket.socket | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._oom: dict[str, int] | None = None
        self._observer_attached = False
        self._thread = threading.Thread(target=self._run, name="gpuwatchd-training", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread after one last report (tests, and ``python -m gpuwatchd.training`` at exit)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self._close()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            self.tick()
            if self._stop.is_set():
                self._close()
                return

    def tick(self) -> bool:
        """Read and send once; whether a line was sent. Never raises."""
        try:
            message = self.message()
        # The training script's safety comes first: whatever torch or our code throws here is counted, not raised.
        except Exception:
            self.errors += 1
            return False
        if message is None:
            return False
        return self._send(wire.encode(message))

    def message(self) -> dict[str, Any] | None:
        """The next line's content, None when there is nothing to say (no CUDA device used, no input wrapped)."""
        torch = sys.modules.get("torch")
        devices = stats.read_devices(torch) if torch is not None else []
        if torch is not None and devices:
            self._attach_observer(torch)
        wait = self.meter.take()
        oom, self._oom = self._oom, None
        if not devices and wait is None and oom is None:
            return None
        out: dict[str, Any] = {"v": wire.SCHEMA_VERSION, "pid": os.getpid(), "t": time.time(),
                               "devices": [stats.summarize(d) for d in devices]}
        if wait is not None:
            out["input_wait_ratio"] = wait
        if oom is not None:
            out["oom"] = oom
        if self.errors:
            out["client_errors"] = self.errors
        return out

    def _attach_observer(self, torch: Any) -> None:
        """torch's out-of-memory observer (``torch._C._cuda_attach_out_of_memory_observer``, absent from CPU builds):
        an OOM is sent at once, with what was asked for and what the device had."""
        if self._observer_attached:
            return
        self._observer_attached = True
        attach = getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)
        if attach is not None:
            attach(self.on_oom)

    def on_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        """The observer: remember the latest OOM (cuDNN retries call it more than once per OOM) and wake the thread."""
        self._oom = {"device": int(device), "requested_bytes": int(alloc),
                     "device_allocated_bytes": int(device_allocated), "device_free_bytes": int(device_free)}
        self._wake.set()

    def _send(self, line: bytes) -> bool:
        if self._sock is not None and self._peer_closed(self._sock):
            self._close()
        for attempt in (0, 1):  # a daemon restart closes the old connection: reconnect once
            sock = self._sock or self._connect()
            if sock is None:
                return False
            try:
                sock.sendall(line)
            except OSError:
                self._close()
                if attempt:
                    return False
                continue
            self.sent += 1
            return True
        return False

    @staticmethod
    def _peer_closed(sock: socket.socket) -> bool:
        """Whether the daemon closed the connection (restarted, or refused us with a one-line reason, which is
        read and dropped): a send into a closed connection succeeds once and the line is lost."""
        sock.settimeout(0.0)  # with a timeout set, recv would wait for it before saying "nothing to read"
        try:
            for _ in range(16):
                try:
                    data = sock.recv(4096)
                except BlockingIOError:
                    return False
                except OSError:
                    return True
                if not data:
                    return True
            return True  # a daemon that keeps talking is not one we know: start afresh
        finally:
            sock.settimeout(SEND_TIMEOUT_SECONDS)

    def _connect(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(SEND_TIMEOUT_SECONDS)
        try:
            sock.connect(str(self.path))
        except OSError:  # no daemon listening: nothing to do until the next interval
            sock.close()
            return None
        self._sock = sock
        return sock

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
