"""GPU fabric and P2P status in the stand-in's state (docs/sim-state.md), served by ``standin_fabric.c``:

- ``fabric``: ``{"state": 0..3, "status": "SUCCESS"|NVML error name, "clique_id", "cluster_uuid" (32 hex digits),
  "health_mask", "health_summary"}`` -> ``nvmlDeviceGetGpuFabricInfoV``; absent or null: NOT_SUPPORTED (a PCIe or
  laptop GPU). ``state`` is NVML_GPU_FABRIC_STATE_* (0 not supported, 1 not started, 2 in progress, 3 completed).
- ``p2p``: ``{"*": {...}, "<peer index>": {...}}`` with per-capability ``nvmlGpuP2PStatus_t`` numbers
  (``read write nvlink atomics pci``; 0 OK, 5 NOT_SUPPORTED, ...) -> ``nvmlDeviceGetP2PStatus``; ``"*"`` is every
  peer without its own entry; absent or null: the call answers NOT_SUPPORTED.
"""

from __future__ import annotations

from typing import Any

from gpuwatchd.sim.state_encode import _U32, _dict, _Enc, _error_code, _fail, _int

FABRIC_KEYS = ("state", "status", "clique_id", "cluster_uuid", "health_mask", "health_summary")
# nvmlGpuP2PCapsIndex_t order (nvml.h) up to NVML_P2P_CAPS_INDEX_UNKNOWN; the stand-in's p2p line order.
P2P_CAPS = ("read", "write", "nvlink", "atomics", "pci")
P2P_STATUS_MAX = 6  # NVML_P2P_STATUS_UNKNOWN
P2P_MAX_PEERS = 64  # standin.h
_FABRIC_STATE_MAX = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
_HEX = frozenset("0123456789abcdefABCDEF")


def encode_fabric(e: _Enc, p: str, d: dict[str, Any]) -> None:
    """The ``fabric``, ``fabric_cluster``, ``p2p_default`` and ``p2p`` lines of one device."""
    if d.get("fabric") is not None:
        q = f"{p}.fabric"
        f = _dict(q, d["fabric"], FABRIC_KEYS, required=("state",))
        status = f.get("status", "SUCCESS")
        code = 0 if status == "SUCCESS" else _error_code(f"{q}.status", status)
        e.put("fabric", _int(f"{q}.state", f["state"], 0, _FABRIC_STATE_MAX), code,
              _int(f"{q}.clique_id", f.get("clique_id", 0), 0, _U32),
              _int(f"{q}.health_mask", f.get("health_mask", 0), 0, _U32),
              _int(f"{q}.health_summary", f.get("health_summary", 0), 0, 255))
        cluster = f.get("cluster_uuid")
        if cluster is not None:
            text = str(cluster).replace("-", "")
            if not isinstance(cluster, str) or len(text) != 32 or not set(text) <= _HEX:
                raise _fail(f"{q}.cluster_uuid", f"expected 32 hex digits (dashes allowed), got {cluster!r}")
            e.put("fabric_cluster", text.lower())
    if d.get("p2p") is None:
        return
    peers = _dict(f"{p}.p2p", d["p2p"], {"*", *map(str, range(P2P_MAX_PEERS))})
    for peer, raw in sorted(peers.items(), key=lambda kv: -1 if kv[0] == "*" else int(kv[0])):
        q = f"{p}.p2p.{peer}"
        caps = _dict(q, raw, P2P_CAPS)
        vals = [_int(f"{q}.{c}", caps.get(c), 0, P2P_STATUS_MAX, nullable=True) for c in P2P_CAPS]
        if peer == "*":
            e.put("p2p_default", *vals)
        else:
            e.put("p2p", int(peer), *vals)
