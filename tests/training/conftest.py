"""Recorded allocator output (tests/fixtures/training/README.md) and a listening unix socket standing for the daemon."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "training"
RECORDED = sorted(p.name for p in FIXTURES.glob("*.json"))


def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return data


class Listener:
    """A unix stream server on its own thread that keeps every line it receives."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[bytes] = []
        self._conns: list[socket.socket] = []
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(str(path))
        self._srv.listen(8)
        self._srv.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            for line in f:
                self.lines.append(line)

    @property
    def connections(self) -> int:
        return len(self._conns)

    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in list(self.lines)]

    def close(self) -> None:
        self._stop.set()
        self._srv.close()
        for conn in self._conns:  # a daemon that stops closes its connections
            with contextlib.suppress(OSError):  # already closed by its reader
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    lst = Listener(tmp_path / "training.sock")
    yield lst
    lst.close()
