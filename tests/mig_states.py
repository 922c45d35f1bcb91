"""A stand-in GPU in MIG mode, shared by the MIG tests (stand-in, worker, daemon)."""

from __future__ import annotations

from typing import Any

from gpuwatchd.sim.state import make_device

GIB = 1 << 30


def a100(index: int = 0, **overrides: Any) -> dict[str, Any]:
    """An A100 80GB in MIG mode with a 3g.40gb (gi 2), a 1g.10gb (gi 9) at MIG index 2 and slot 1 empty."""
    dev = make_device(
        index, name="NVIDIA A100-SXM4-80GB", mig_mode=[1, 1],
        memory={"total": 80 * GIB, "reserved": GIB, "used": 30 * GIB},
        processes={"compute": [{"pid": 77, "used_memory": GIB}]},
        mig_devices=[
            {"index": 0, "uuid": "MIG-aaaaaaaa-0000-5000-8000-000000000001", "profile": "3g.40gb",
             "gpu_instance_id": 2, "compute_instance_id": 0,
             "memory": {"total": 40 * GIB, "used": 20 * GIB},
             "processes": {"compute": [{"pid": 4242, "used_memory": 19 * GIB}]}},
            {"index": 2, "uuid": "MIG-aaaaaaaa-0000-5000-8000-000000000002", "profile": "1g.10gb",
             "gpu_instance_id": 9, "compute_instance_id": 0,
             "memory": {"total": 10 * GIB, "used": 5 * GIB},
             "processes": {"compute": [{"pid": 4343, "used_memory": 4 * GIB}, {"pid": 4344, "used_memory": None}]}},
        ],
    )
    dev.update(overrides)
    return dev
