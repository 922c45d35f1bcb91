"""``python -m gpuwatchd.sources.nvml.worker.doctor``: the NVML facts ``gpuwatchd doctor`` checks, one JSON line at a
time.

Run by ``gpuwatchd/doctor/nvml_probe.py`` in a child process under a deadline (this module imports pynvml, which
only ``sources/nvml/worker/`` may). Lines are written as each fact is read, so when a wedged GPU makes a call hang
the parent still has everything before it and knows which GPU it was (the last ``{"gpu_start": i}``):

    {"init": "ok"} | {"init": "<reason>", "code": N, "message": "..."}
    {"system": {"driver_version", "nvml_version", "cuda_driver_version", "count"}}
    {"gpu_start": i}
    {"gpu": {"index", "uuid", "name", "pci_bus_id", "pcie_gen", "pcie_max_gen", "pcie_width", "pcie_max_width",
             "utilization_gpu", "persistence_mode", "power_limit_mw", "power_default_limit_mw",
             "remap_pending", "remap_failure", "retired_pending", "clocks_event_reasons", "pcie_replay_counter",
             "cuda_cc" ([major, minor]), "error"}}
    {"replays": {"index", "counter", "seconds"}}  per GPU, the replay counter read again --replay-window seconds
                                                  after its first read (a rate: issue 28)
    {"done": true}
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import pynvml as N

from gpuwatchd.sources.nvml.worker.errors import reason

TYPE_CHECKING = False  # typing.TYPE_CHECKING, which mypy reads the same, without importing typing (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _try(fn: Callable[[], Any]) -> Any:
    """A reading, or None when the GPU/driver does not give it (not supported, no permission, ...)."""
    try:
        return fn()
    except N.NVMLError:
        return None


def _text(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v  # pynvml 11.x returned bytes


def _gpu(i: int) -> dict[str, Any]:
    try:
        h = N.nvmlDeviceGetHandleByIndex(i)
    except N.NVMLError as e:
        return {"index": i, "error": reason(e.value)}
    pci = _try(lambda: N.nvmlDeviceGetPciInfo(h))
    util = _try(lambda: N.nvmlDeviceGetUtilizationRates(h))
    remap = _try(lambda: N.nvmlDeviceGetRemappedRows(h))
    reasons = _try(lambda: N.nvmlDeviceGetCurrentClocksEventReasons(h))
    if reasons is None:
        reasons = _try(lambda: N.nvmlDeviceGetCurrentClocksThrottleReasons(h))
    retired = _try(lambda: N.nvmlDeviceGetRetiredPagesPendingStatus(h))
    return {
        "index": i,
        "uuid": _text(_try(lambda: N.nvmlDeviceGetUUID(h))),
        "name": _text(_try(lambda: N.nvmlDeviceGetName(h))),
        "pci_bus_id": f"{pci.domain:04x}:{pci.bus:02x}:{pci.device:02x}.0" if pci is not None else None,
        "pcie_gen": _try(lambda: N.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        "pcie_max_gen": _try(lambda: N.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        "pcie_width": _try(lambda: N.nvmlDeviceGetCurrPcieLinkWidth(h)),
        "pcie_max_width": _try(lambda: N.nvmlDeviceGetMaxPcieLinkWidth(h)),
        "utilization_gpu": util.gpu if util is not None else None,
        "persistence_mode": _try(lambda: N.nvmlDeviceGetPersistenceMode(h)),
        "power_limit_mw": _try(lambda: N.nvmlDeviceGetEnforcedPowerLimit(h)),
        "power_default_limit_mw": _try(lambda: N.nvmlDeviceGetPowerManagementDefaultLimit(h)),
        "remap_pending": bool(remap[2]) if remap is not None else None,
        "remap_failure": bool(remap[3]) if remap is not None else None,
        "retired_pending": None if retired is None else bool(retired),
        "clocks_event_reasons": reasons,
        "pcie_replay_counter": _try(lambda: N.nvmlDeviceGetPcieReplayCounter(h)),
        "cuda_cc": _try(lambda: list(N.nvmlDeviceGetCudaComputeCapability(h))),
        "error": None,
    }


def _replays_again(first: dict[int, tuple[float, int]], window: float) -> None:
    """Each GPU's replay counter ``window`` seconds after its first read (from which doctor tells a rate)."""
    if not first:
        return
    time.sleep(max(0.0, window - (time.monotonic() - min(t for t, _ in first.values()))))
    for i, (t0, _) in first.items():
        _emit({"gpu_start": i})
        try:
            n = N.nvmlDeviceGetPcieReplayCounter(N.nvmlDeviceGetHandleByIndex(i))
        except N.NVMLError:
            continue
        if n is not None:
            _emit({"replays": {"index": i, "counter": n, "seconds": time.monotonic() - t0}})


def main() -> int:
    window = float(sys.argv[sys.argv.index("--replay-window") + 1]) if "--replay-window" in sys.argv else 0.0
    try:
        N.nvmlInitWithFlags(N.NVML_INIT_FLAG_NO_GPUS)
    except N.NVMLError as e:
        _emit({"init": reason(e.value), "code": e.value, "message": str(e)})
        return 0
    _emit({"init": "ok"})
    count = _try(N.nvmlDeviceGetCount) or 0
    _emit(
        {
            "system": {
                "driver_version": _text(_try(N.nvmlSystemGetDriverVersion)),
                "nvml_version": _text(_try(N.nvmlSystemGetNVMLVersion)),
                "cuda_driver_version": _try(N.nvmlSystemGetCudaDriverVersion_v2),
                "count": count,
            }
        }
    )
    first: dict[int, tuple[float, int]] = {}
    for i in range(count):
        _emit({"gpu_start": i})
        t0 = time.monotonic()
        g = _gpu(i)
        _emit({"gpu": g})
        if g.get("pcie_replay_counter") is not None:
            first[i] = (t0, g["pcie_replay_counter"])
    if window > 0:
        _replays_again(first, window)
    _emit({"done": True})
    _try(N.nvmlShutdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
