"""The training socket: a unix stream server that takes ``gpuwatchd.training`` lines into the store.

Nothing a client sends can crash, stall or grow the daemon: connections are capped (``max_peers``), a line longer
than ``max_message_bytes`` closes its connection, lines closer than ``min_interval`` are dropped (a flood of them
closes the connection), a silent connection is closed after ``idle_timeout``, and a line is taken only from a process
NVML lists on a GPU (peer identified by the kernel, ``peer.py``). Every refusal is counted by reason in
``gpuwatchd_training_messages_total`` / ``gpuwatchd_training_connections_total`` and logged at debug level.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
from collections.abc import Mapping
from pathlib import Path

from gpuwatchd.config.training import TrainingConfig
from gpuwatchd.model.training import TrainingSocketStatus
from gpuwatchd.runtime.clock import Clock
from gpuwatchd.sources.training import message, peer
from gpuwatchd.store import Store

log = logging.getLogger(__name__)

SOCKET_NAME = "training.sock"  # gpuwatchd/training/wire.py SOCKET_NAME
DEFAULT_RUNTIME_DIR = Path("/run/gpuwatchd")
RETRY_BIND_SECONDS = 60.0  # a socket path in use or unwritable: try again this often, the daemon keeps running
FLOOD_DROPS = 20  # lines dropped in a row for coming too fast before the connection is closed
BURST = 4  # lines a connection may send back to back (a report, then an OOM's at once) before min_interval applies
REFUSALS_BEFORE_CLOSE = 30  # lines in a row from a process without a GPU context (5 min at 10 s) before closing
CONNECTION_RESULTS = ("accepted", "too_many_peers", "no_credentials")
MESSAGE_RESULTS = ("accepted", "oversized", "malformed", "unsupported_version", "no_gpu_context", "rate_limited",
                   "unmatched_device")


def default_socket_path(env: Mapping[str, str]) -> Path:
    """training.sock in the runtime directory: systemd's ``$RUNTIME_DIRECTORY``, else /run/gpuwatchd when it is (or
    can be made) writable, else ``$XDG_RUNTIME_DIR/gpuwatchd``, else /run/gpuwatchd (and the bind says why not)."""
    systemd = env.get("RUNTIME_DIRECTORY", "")
    if systemd:
        return Path(systemd.split(":")[0]) / SOCKET_NAME
    try:
        DEFAULT_RUNTIME_DIR.mkdir(mode=0o755, exist_ok=True)
        if os.access(DEFAULT_RUNTIME_DIR, os.W_OK):
            return DEFAULT_RUNTIME_DIR / SOCKET_NAME
    except OSError:
        pass
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "gpuwatchd" / SOCKET_NAME
    return DEFAULT_RUNTIME_DIR / SOCKET_NAME


class TrainingListener:
    """Serves the training socket until cancelled; its state goes into the store as ``TrainingSocketStatus``."""

    def __init__(self, config: TrainingConfig, store: Store, clock: Clock, path: Path,
                 proc_root: Path = Path("/proc")) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.path = path
        self.proc_root = proc_root
        self.peers = 0
        self.connections = dict.fromkeys(CONNECTION_RESULTS, 0)
        self.messages = dict.fromkeys(MESSAGE_RESULTS, 0)
        self.error: str | None = None
        self._server: asyncio.AbstractServer | None = None

    def _publish(self) -> None:
        self.store.ingest(TrainingSocketStatus(self._server is not None, str(self.path), self.error, self.peers,
                                               dict(self.connections), dict(self.messages)))

    async def run(self) -> None:
        """Bind (retrying while the path is unusable), serve, and remove the socket when cancelled."""
        try:
            while True:
                try:
                    self._server = await self._bind()
                except OSError as e:
                    self.error = f"cannot listen on {self.path}: {e.strerror or e}"
                    log.warning("training socket: %s; retrying every %ds", self.error, RETRY_BIND_SECONDS)
                    self._publish()
                    await asyncio.sleep(RETRY_BIND_SECONDS)
                    continue
                self.error = None
                self._publish()
                log.info("training socket listening on %s", self.path)
                await asyncio.Event().wait()  # serve until cancelled
        finally:
            if self._server is not None:
                self._server.close()
                with contextlib.suppress(OSError):
                    self.path.unlink()
                self._server = None

    async def _bind(self) -> asyncio.AbstractServer:
        self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        self._clear_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.path))
            # Any local user's job may report: who it is comes from the kernel, not from the socket's mode.
            os.chmod(self.path, 0o666)  # noqa: S103
        except OSError:
            sock.close()
            raise
        return await asyncio.start_unix_server(self._serve, sock=sock, limit=self.config.max_message_bytes + 1)

    def _clear_stale(self) -> None:
        """Remove a socket left by a daemon that died; refuse to remove anything else, or a live daemon's socket."""
        try:
            st = self.path.lstat()
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(errno.EEXIST, "exists and is not a socket (not removed)")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(self.path))
        except ConnectionRefusedError:
            self.path.unlink()
            return
        except OSError:
            return
        finally:
            probe.close()
        raise OSError(errno.EADDRINUSE, "another gpuwatchd listens there")

    def _gpus_of(self, host_pid: int) -> set[str]:
        snap = self.store.latest
        if snap is None:
            return set()
        return {g.uuid for g in snap.gpus if any(p.pid == host_pid for p in g.processes)}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if self.peers >= self.config.max_peers:
            await self._refuse(writer, "too_many_peers", "too many training processes connected")
            return
        who = peer.identify(sock, self.proc_root) if sock is not None else None
        if who is None:
            await self._refuse(writer, "no_credentials", "no peer credentials")
            return
        self.peers += 1
        self.connections["accepted"] += 1
        self._publish()
        try:
            await self._read(reader, writer, who)
        finally:
            self.peers -= 1
            self._publish()
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, who: peer.Peer) -> None:
        cfg = self.config
        tokens = float(BURST)
        refilled: float | None = None
        dropped = refused = 0
        loop = asyncio.get_running_loop()
        while True:
            try:
                line = await asyncio.wait_for(reader.readline(), cfg.idle_timeout)
            except (asyncio.LimitOverrunError, ValueError):  # longer than max_message_bytes
                self._count("oversized")
                await self._say(writer, f"line longer than {cfg.max_message_bytes} bytes")
                return
            except (TimeoutError, ConnectionError):
                return
            if not line:
                return
            now = loop.time()
            if refilled is not None:
                tokens = min(float(BURST), tokens + (now - refilled) / cfg.min_interval)
            refilled = now
            if tokens < 1.0:
                self._count("rate_limited")
                dropped += 1
                if dropped >= FLOOD_DROPS:
                    await self._say(writer, f"more than one line per {cfg.min_interval:g}s")
                    return
                continue
            dropped = 0
            tokens -= 1.0
            gpus = self._gpus_of(who.host_pid)
            try:
                parsed = message.parse(line, who.host_pid, gpus, self.clock.now())
            except message.Refused as e:
                self._count(e.reason)
                log.debug("training socket: pid %d (uid %d): %s", who.host_pid, who.uid, e)
                refused += 1
                if e.reason != "no_gpu_context" or refused >= REFUSALS_BEFORE_CLOSE:
                    await self._say(writer, str(e))
                    return
                continue
            refused = 0
            for report in parsed.reports:
                self.store.ingest(report)
            if parsed.unmatched:
                self.messages["unmatched_device"] += parsed.unmatched
            self._count("accepted")

    def _count(self, result: str) -> None:
        self.messages[result] += 1
        self._publish()

    async def _refuse(self, writer: asyncio.StreamWriter, result: str, why: str) -> None:
        self.connections[result] += 1
        self._publish()
        await self._say(writer, why)
        writer.close()

    @staticmethod
    async def _say(writer: asyncio.StreamWriter, why: str) -> None:
        """One line telling the client why it is being closed (for whoever debugs it with socat); never waits long."""
        writer.write(message.refusal_line(why))
        with contextlib.suppress(OSError, ConnectionError, TimeoutError):
            await asyncio.wait_for(writer.drain(), 1.0)
