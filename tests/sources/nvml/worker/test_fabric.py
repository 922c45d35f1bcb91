"""GPU fabric registration (nvmlDeviceGetGpuFabricInfoV) and P2P status (nvmlDeviceGetP2PStatus) through the real
pynvml and the stand-in driver, to gpuwatchd_gpu_fabric_state and gpuwatchd_gpu_p2p_status; a GPU without a fabric
and a host with one GPU export nothing of either."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatchd.exporter.fabric_families import fabric_families
from gpuwatchd.sim.state import make_device, make_state
from tests.sources.workerutil import run_worker, snap

StateWriter = Callable[[dict[str, Any]], Path]
CLUSTER = "0123456789abcdef0123456789abcdef"


def _states(families: list[Any]) -> dict[str, str]:
    fam = {m.name: m for m in families}.get("gpuwatchd_gpu_fabric_state")
    if fam is None:
        return {}
    return {s.labels["uuid"]: s.labels["state"] for s in fam.samples if s.value == 1}


def test_fabric_states_and_p2p_between_pairs(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    devices = [
        make_device(0, fabric={"state": 3, "clique_id": 7, "cluster_uuid": CLUSTER},
                    p2p={"*": {"read": 0, "write": 0, "nvlink": 0}}),
        make_device(1, fabric={"state": 2}, p2p={"*": {"read": 0, "write": 0, "nvlink": 0}, "0": {"nvlink": 5}}),
        make_device(2, fabric={"state": 3, "status": "UNKNOWN"}),  # completed with an error: failed
        make_device(3, fabric={"state": 0}),  # the struct says NOT_SUPPORTED: no reading
        make_device(4, errors={"nvmlDeviceGetGpuFabricInfoV": "UNKNOWN"}, fabric={"state": 1}),
    ]
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(5, devices=devices)), max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    gpus = snap(lines[1]).gpus
    assert [g.fabric_state for g in gpus] == [3, 2, 3, None, None]
    assert gpus[0].fabric_clique_id == 7
    assert gpus[0].fabric_cluster_uuid == "01234567-89ab-cdef-0123-456789abcdef"
    assert gpus[2].fabric_status == 999  # NVML_ERROR_UNKNOWN
    assert gpus[4].errors == {"fabric_state": "unknown"}
    uuids = [d["uuid"] for d in devices]
    # GPU 0 and 1 answer for every peer; 2-4 have no p2p lines (NOT_SUPPORTED: learned absent)
    assert gpus[0].p2p_status == {u: {"read": 0, "write": 0, "nvlink": 0} for u in uuids[1:]}
    assert gpus[1].p2p_status[uuids[0]] == {"read": 0, "write": 0, "nvlink": 5}
    assert [g.p2p_status for g in gpus[2:]] == [{}, {}, {}]
    assert _states(fabric_families(gpus)) == {uuids[0]: "completed", uuids[1]: "in_progress", uuids[2]: "failed"}
    fam = {m.name: m for m in fabric_families(gpus)}
    assert len([s for s in fam["gpuwatchd_gpu_fabric_state"].samples if s.labels["uuid"] == uuids[0]]) == 4
    p2p = {(s.labels["uuid"], s.labels["peer_uuid"], s.labels["capability"]): s.value
           for s in fam["gpuwatchd_gpu_p2p_status"].samples}
    assert p2p[(uuids[1], uuids[0], "nvlink")] == 5
    assert p2p[(uuids[0], uuids[4], "write")] == 0
    assert len(p2p) == 2 * 4 * 3
    # P2P is a static reading: asked on the first poll only (4 peers x 3 capabilities), then learned absent on 2-4
    assert lines[0]["calls"]["nvmlDeviceGetP2PStatus"] == 2 * 12 + 3
    assert "nvmlDeviceGetP2PStatus" not in lines[1]["calls"]


def test_a_single_gpu_and_a_laptop_export_nothing_new(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    # one GPU: no peer to ask, no fabric (a PCIe board or an eGPU laptop answers NOT_SUPPORTED)
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(1)), max_polls=2, trace_calls=True)
    assert code == 0, err
    gpus = snap(lines[1]).gpus
    assert fabric_families(gpus) == []
    assert gpus[0].errors == {}
    assert "nvmlDeviceGetP2PStatus" not in lines[0]["calls"]
    assert lines[0]["calls"]["nvmlDeviceGetGpuFabricInfoV"] == 1  # learned absent on the first poll
    assert "nvmlDeviceGetGpuFabricInfoV" not in lines[1]["calls"]


def test_a_bad_fabric_state_names_the_key(tmp_path: Path) -> None:
    import pytest

    from gpuwatchd.sim.state import encode_state

    with pytest.raises(ValueError, match=r"devices\[0\]\.fabric\.cluster_uuid"):
        encode_state(make_state(1, devices=[make_device(0, fabric={"state": 3, "cluster_uuid": "xyz"})]))
    with pytest.raises(ValueError, match=r"devices\[0\]\.p2p\.0\.nvlink"):
        encode_state(make_state(1, devices=[make_device(0, p2p={"0": {"nvlink": 9}})]))
