"""The pod-resources client against a real gRPC server on a unix socket (several pods, MIG and whole GPUs, a GPU
shared by time-slicing replicas, devices of other resources), and a slow or broken kubelet."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from gpuwatchd.model import GpuPod
from gpuwatchd.sources.attribution.kubelet import PodResourcesError, list_gpu_pods
from tests.sources.attribution.kubelet_server import serve

G0 = "GPU-11111111-2222-3333-4444-555555555555"
G1 = "GPU-66666666-7777-8888-9999-000000000000"
M0 = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
M1 = "MIG-ffffffff-0000-1111-2222-333333333333"

PODS = {
    ("ml", "trainer-0"): {"trainer": [("nvidia.com/gpu", [G0])], "sidecar": [("example.com/fpga", ["fpga-0"])]},
    ("ml", "notebook-a"): {"jupyter": [("nvidia.com/gpu", [f"{G1}::0"])]},  # time-sliced replicas of G1
    ("research", "notebook-b"): {"jupyter": [("nvidia.com/gpu", [f"{G1}::3"])]},
    ("infer", "server"): {"triton": [("nvidia.com/mig-1g.10gb", [M0, M1])]},
    ("kube-system", "nic"): {"agent": [("rdma/hca", ["mlx5_0"])]},  # not a GPU: ignored
}


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "kubelet.sock"


def test_list_maps_gpu_and_mig_uuids_to_pods(sock: Path) -> None:
    with serve(sock, PODS):
        pods = list_gpu_pods(sock, timeout=10.0).pods
    assert pods == (
        GpuPod(G0, "ml", "trainer-0", "trainer"),
        GpuPod(G1, "ml", "notebook-a", "jupyter"),
        GpuPod(G1, "research", "notebook-b", "jupyter"),
        GpuPod(M0, "infer", "server", "triton"),
        GpuPod(M1, "infer", "server", "triton"),
    )


def test_no_socket_is_unavailable(sock: Path) -> None:
    with pytest.raises(PodResourcesError) as e:
        list_gpu_pods(sock, timeout=5.0)
    assert e.value.reason in ("unavailable", "deadline_exceeded")


def test_a_slow_kubelet_is_cut_at_the_deadline(sock: Path) -> None:
    with serve(sock, PODS) as kubelet:
        kubelet.delay = 600.0  # answers only when the server goes, long after the deadline
        with pytest.raises(PodResourcesError) as e:
            list_gpu_pods(sock, timeout=1.0)
        assert e.value.reason == "deadline_exceeded"  # returned at the deadline: the kubelet never answered


def test_a_broken_kubelet_says_why(sock: Path) -> None:
    with serve(sock, PODS) as kubelet:
        kubelet.fail = grpc.StatusCode.INTERNAL
        with pytest.raises(PodResourcesError) as e:
            list_gpu_pods(sock, timeout=10.0)
    assert e.value.reason == "internal" and "stand-in kubelet told to fail" in str(e.value)


def test_a_socket_that_is_not_grpc(sock: Path) -> None:
    sock.write_text("not a socket")
    with pytest.raises(PodResourcesError):
        list_gpu_pods(sock, timeout=5.0)
