"""A device's GPM activity in the stand-in's state (``devices[N].gpm``, docs/sim-state.md) and its state lines.

The values are the GPM metrics' own (nvml.h ``nvmlGpmMetricId_t``): percent 0..100 for activities, MiB/s for
rates, keyed by the metric's name without its ``NVML_GPM_METRIC_`` prefix, lower case. The stand-in
(``standin_gpm.c``) integrates them over time into the cumulative counters its samples carry.

Lines (in the device block): ``gpm <supported 0|1> <value>...`` with one value per :data:`GPM_METRICS` entry, in
millionths of its unit ("-" = not supported), then ``gpm_instance <gpu instance id> <value>...`` per instance and
``gpm_metric_error <metric id> <nvmlReturn_t>`` per injected per-metric error.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpuwatchd.sim.standin_abi import ERROR_CODES

if TYPE_CHECKING:
    from collections.abc import Callable

# (state key, nvml.h NVML_GPM_METRIC_* id), in standin_gpm.c GPM_METRICS order (tests/sim/test_standin_gpm.py).
GPM_METRICS: tuple[tuple[str, int], ...] = (
    ("graphics_util", 1),
    ("sm_util", 2),
    ("sm_occupancy", 3),
    ("integer_util", 4),
    ("any_tensor_util", 5),
    ("dfma_tensor_util", 6),
    ("hmma_tensor_util", 7),
    ("dmma_tensor_util", 8),
    ("imma_tensor_util", 9),
    ("dram_bw_util", 10),
    ("fp64_util", 11),
    ("fp32_util", 12),
    ("fp16_util", 13),
    ("pcie_tx_per_sec", 20),
    ("pcie_rx_per_sec", 21),
    ("nvlink_total_rx_per_sec", 60),
    ("nvlink_total_tx_per_sec", 61),
)
METRIC_IDS = dict(GPM_METRICS)
_RATE_MAX = 1 << 30  # MiB/s: far above any link (an NVLink 5 GPU moves ~1.7e6 MiB/s)
_GPU_INSTANCE_MAX = 1 << 16
KEYS = frozenset([*METRIC_IDS, "supported", "instances", "metric_errors"])


def _value(path: str, v: object, rate: bool) -> str:
    if v is None:
        return "-"  # this metric: NOT_SUPPORTED in its own nvmlReturn
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{path}: expected a number, got {v!r}")
    hi = _RATE_MAX if rate else 100
    if not 0 <= v <= hi:
        raise ValueError(f"{path}: {v} is outside 0..{hi} ({'MiB/s' if rate else 'percent'})")
    return str(round(v * 1_000_000))  # millionths of the unit: the C side reads integers


def _values(path: str, d: dict[str, Any]) -> list[str]:
    return [_value(f"{path}.{k}", d.get(k), k.endswith("_per_sec")) for k, _ in GPM_METRICS]


def encode_gpm(put: Callable[..., None], path: str, gpm: object) -> None:
    """Validate ``devices[N].gpm`` and write its lines through ``put(key, *args)``; ValueError names the key path."""
    if not isinstance(gpm, dict):
        raise ValueError(f"{path}: expected an object, got {type(gpm).__name__}")
    for k in gpm:
        if k not in KEYS and not str(k).startswith("_"):
            raise ValueError(f"{path}.{k}: unknown key (known: {', '.join(sorted(KEYS))})")
    supported = gpm.get("supported", True)
    if not isinstance(supported, bool):
        raise ValueError(f"{path}.supported: expected a boolean, got {supported!r}")
    put("gpm", int(supported), *_values(path, gpm))
    instances = gpm.get("instances") or {}
    if not isinstance(instances, dict):
        raise ValueError(f"{path}.instances: expected an object of GPU instance id -> metrics")
    if len(instances) > 8:
        raise ValueError(f"{path}.instances: at most 8 GPU instances")
    for gi, metrics in instances.items():
        q = f"{path}.instances.{gi}"
        if not str(gi).isdigit() or int(gi) >= _GPU_INSTANCE_MAX:
            raise ValueError(f"{q}: a GPU instance id is a small non-negative integer")
        if not isinstance(metrics, dict) or any(k not in METRIC_IDS for k in metrics):
            raise ValueError(f"{q}: expected an object of GPM metrics ({', '.join(METRIC_IDS)})")
        put("gpm_instance", int(gi), *_values(q, metrics))
    errors = gpm.get("metric_errors") or {}
    if not isinstance(errors, dict):
        raise ValueError(f"{path}.metric_errors: expected an object of metric -> NVML error name")
    for metric, code in errors.items():
        q = f"{path}.metric_errors.{metric}"
        if metric not in METRIC_IDS:
            raise ValueError(f"{q}: unknown GPM metric (known: {', '.join(METRIC_IDS)})")
        if code not in ERROR_CODES:
            raise ValueError(f"{q}: unknown NVML error {code!r} (use NVML_ERROR_* names without the prefix)")
        put("gpm_metric_error", METRIC_IDS[metric], ERROR_CODES[code])


def gpm_schema() -> dict[str, Any]:
    """The scenario schema of ``devices[N].gpm`` (sim/scenario_fields.py): every metric a float."""
    return {"supported": True, **{k: 0.0 for k, _ in GPM_METRICS}, "instances": {}, "metric_errors": {}}
