"""A real gRPC server on a unix socket serving the kubelet's ``v1.PodResourcesLister`` (tests' stand-in kubelet).

It answers ``List`` from a plain description (``{(namespace, pod): {container: [(resource, [device ids])]}}``)
that tests can swap while it runs, can be made slow (sleep before answering), late (``gate``: no answer until the
test opens it) or broken (abort with a status).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from gpuwatchd.sources.attribution.podresources import api_pb2, api_pb2_grpc

Pods = Mapping[tuple[str, str], Mapping[str, Sequence[tuple[str, Sequence[str]]]]]


def response(pods: Pods) -> Any:
    out = api_pb2.ListPodResourcesResponse()
    for (ns, name), containers in pods.items():
        pr = out.pod_resources.add(name=name, namespace=ns)
        for cname, devices in containers.items():
            c = pr.containers.add(name=cname)
            for resource, ids in devices:
                c.devices.add(resource_name=resource, device_ids=list(ids))
            c.cpu_ids.extend([2, 3])  # exclusive CPUs: a real answer has more than devices
    return out


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, pods: Pods) -> None:
        self.pods = pods
        self.delay = 0.0
        self.fail: grpc.StatusCode | None = None
        self.calls = 0
        self.lock = threading.Lock()
        self.released = threading.Event()  # set when the server goes: a slow answer stops waiting then
        self.gate = threading.Event()  # List answers only once this is set (cleared: a kubelet answering late)
        self.gate.set()
        self.answered = 0  # List calls answered (not failed)

    def List(self, request: Any, context: Any) -> Any:
        with self.lock:
            self.calls += 1
            delay, fail, pods = self.delay, self.fail, self.pods
        if delay:
            self.released.wait(delay)
        while not self.gate.wait(0.05) and not self.released.is_set():
            pass
        with self.lock:
            fail, pods = self.fail, self.pods  # what holds when it finally answers
        if fail is not None:
            context.abort(fail, "stand-in kubelet told to fail")
        with self.lock:
            self.answered += 1
        return response(pods)


@contextmanager
def serve(socket: Path, pods: Pods) -> Iterator[Kubelet]:
    kubelet = Kubelet(pods)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield kubelet
    finally:
        kubelet.released.set()
        server.stop(grace=None)
