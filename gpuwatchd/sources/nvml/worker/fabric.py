"""GPU fabric registration and P2P status between GPU pairs (runs only inside the NVML worker process).

- ``fabric``: ``nvmlDeviceGetGpuFabricInfoV`` with pynvml's ``c_nvmlGpuFabricInfoV_t`` (nvmlGpuFabricInfo_v2_t, its
  ``version`` set by the struct; R535+ drivers take it, v3 only adds the health summary). pynvml binds the call
  without argtypes, so the struct goes by reference. nvml.h types ``state`` as an unsigned char where pynvml has a
  c_uint: only the low byte is the state (the rest is padding). A GPU outside any fabric (PCIe, a laptop) answers
  NOT_SUPPORTED, or state NOT_SUPPORTED, and has no reading. ``status`` is the registration's own nvmlReturn_t,
  meaningful once the state is COMPLETED (nvml.h).
- ``p2p``: ``nvmlDeviceGetP2PStatus`` from this GPU to every other GPU of the host for the read, write and NVLink
  capabilities (nvmlGpuP2PCapsIndex_t). A host with one GPU has no peer: the reading is absent and calls nothing.
  pynvml spells ``NVML_P2P_CAPS_INDEX_READ = 0,`` (a tuple), so the indices are written here from nvml.h.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import pynvml as N

TYPE_CHECKING = False  # typing.TYPE_CHECKING, which mypy reads the same, without importing typing (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any

    Handle = Any
    Out = dict[str, Any]

# nvmlGpuP2PCapsIndex_t (nvml.h): the capabilities asked per pair, by their label in the metric.
P2P_CAPS: dict[str, int] = {"read": 0, "write": 1, "nvlink": 2}
_STATE_BYTE = 0xFF  # nvmlGpuFabricState_t is an unsigned char (nvml.h)


def _cluster_uuid(raw: Any) -> str:
    b = bytes(raw)
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def read_fabric(h: Handle, out: Out) -> None:
    """``fabric_state`` (NVML_GPU_FABRIC_STATE_*), ``fabric_status``, ``fabric_clique_id``, ``fabric_cluster_uuid``."""
    info = N.c_nvmlGpuFabricInfoV_t()
    N.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
    state = int(info.state) & _STATE_BYTE
    if state == N.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        raise N.NVMLError(N.NVML_ERROR_NOT_SUPPORTED)
    out["fabric_state"] = state
    out["fabric_status"] = int(info.status)
    out["fabric_clique_id"] = int(info.cliqueId)
    out["fabric_cluster_uuid"] = _cluster_uuid(info.clusterUuid)


def p2p_reader(peers: Callable[[], list[tuple[str, Handle]]]) -> Callable[[Handle, Out], None]:
    """A reader of ``p2p_status`` ({peer uuid: {capability: nvmlGpuP2PStatus_t}}) toward ``peers()``'s GPUs."""

    def read(h: Handle, out: Out) -> None:
        others = peers()
        if not others:
            raise N.NVMLError(N.NVML_ERROR_NOT_SUPPORTED)  # no peer: nothing to ask
        status: dict[str, dict[str, int]] = {}
        for uuid, peer in others:
            status[uuid] = {cap: int(N.nvmlDeviceGetP2PStatus(h, peer, index)) for cap, index in P2P_CAPS.items()}
        out["p2p_status"] = status

    return read
