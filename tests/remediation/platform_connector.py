"""A real gRPC server on a unix socket serving NVSentinel's ``datamodels.PlatformConnector`` from gpuwatchd's stubs
(the tests' stand-in platform connector): it keeps every ``HealthEvents`` it receives, and can be told to fail."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2  # type: ignore[import-untyped]

from gpuwatchd.remediation.nvsentinel_pb import health_event_pb2_grpc


class Connector(health_event_pb2_grpc.PlatformConnectorServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.received: list[Any] = []
        self.fail: grpc.StatusCode | None = None
        self.lock = threading.Lock()

    def HealthEventOccurredV1(self, request: Any, context: Any) -> Any:
        with self.lock:
            fail = self.fail
            if fail is None:
                self.received.append(request)
        if fail is not None:
            context.abort(fail, "stand-in platform connector told to fail")
        return empty_pb2.Empty()

    def events(self) -> list[Any]:
        with self.lock:
            return [e for batch in self.received for e in batch.events]


@contextmanager
def serve(socket: Path) -> Iterator[Connector]:
    connector = Connector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_event_pb2_grpc.add_PlatformConnectorServicer_to_server(connector, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield connector
    finally:
        server.stop(grace=None)
