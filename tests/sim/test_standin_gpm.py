"""The stand-in's GPM calls, as nvml.h declares them, through the real pynvml: support, samples, two-sample metrics."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from gpuwatchd.sim.build import build_standin
from gpuwatchd.sim.state import make_device, make_state

if TYPE_CHECKING:
    import ctypes
    from collections.abc import Callable
    from pathlib import Path

    from conftest import Sim

H100 = {"sm_util": 80, "sm_occupancy": 42.5, "any_tensor_util": 60, "hmma_tensor_util": 55, "dram_bw_util": 70,
        "fp32_util": 12, "pcie_rx_per_sec": 2048, "nvlink_total_tx_per_sec": 100000, "fp16_util": None}


def _gpm_state(**gpm: Any) -> dict[str, Any]:
    return make_state(0, devices=[make_device(0, gpm={**H100, **gpm}), make_device(1)])


def _metrics(n: Any, s1: Any, s2: Any, ids: list[int], version: int | None = None) -> Any:
    mg = n.c_nvmlGpmMetricsGet_t()
    mg.version = n.NVML_GPM_METRICS_GET_VERSION if version is None else version
    mg.numMetrics = len(ids)
    mg.sample1, mg.sample2 = s1, s2
    for i, m in enumerate(ids):
        mg.metrics[i].metricId = m
    return n.nvmlGpmMetricsGet(mg)


def _two_samples(n: Any, h: Any, gap: float = 0.05) -> tuple[Any, Any]:
    s1, s2 = n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()
    n.nvmlGpmSampleGet(h, s1)
    time.sleep(gap)
    n.nvmlGpmSampleGet(h, s2)
    return s1, s2


def test_support_per_device(sim: Sim) -> None:
    n = sim.nvml
    sim.update(_gpm_state())
    n.nvmlInit()
    a, b = sim.handles()
    assert n.nvmlGpmQueryDeviceSupport(a).isSupportedDevice == 1
    assert n.nvmlGpmQueryDeviceSupport(b).isSupportedDevice == 0  # an A10G: the call works, the device has no GPM
    s = n.nvmlGpmSampleAlloc()
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlGpmSampleGet(b, s)
    n.nvmlGpmSampleFree(s)
    sim.update(_gpm_state(supported=False))
    assert n.nvmlGpmQueryDeviceSupport(a).isSupportedDevice == 0


def test_support_struct_version_is_checked(sim: Sim) -> None:
    n = sim.nvml
    sim.update(_gpm_state())
    n.nvmlInit()
    a, _ = sim.handles()
    fn = n._nvmlGetFunctionPointer("nvmlGpmQueryDeviceSupport")
    support = n.c_nvmlGpmSupport_t()
    support.version = 2
    assert fn(a, n.byref(support)) == n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


def test_metrics_are_the_state_values_from_two_samples(sim: Sim) -> None:
    n = sim.nvml
    sim.update(_gpm_state())
    n.nvmlInit()
    a, _ = sim.handles()
    s1, s2 = _two_samples(n, a)
    ids = [n.NVML_GPM_METRIC_SM_UTIL, n.NVML_GPM_METRIC_SM_OCCUPANCY, n.NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
           n.NVML_GPM_METRIC_PCIE_RX_PER_SEC, n.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
           n.NVML_GPM_METRIC_FP16_UTIL, n.NVML_GPM_METRIC_NVDEC_0_UTIL]
    got = _metrics(n, s1, s2, ids).metrics
    assert [m.nvmlReturn for m in got[:5]] == [n.NVML_SUCCESS] * 5
    assert [m.value for m in got[:5]] == pytest.approx([80, 42.5, 55, 2048, 100000])
    assert got[0].metricInfo.shortName == b"sm_util"
    assert got[3].metricInfo.unit == b"MiB/sec"
    assert got[5].nvmlReturn == n.NVML_ERROR_NOT_SUPPORTED  # null in the state
    assert got[6].nvmlReturn == n.NVML_ERROR_NOT_SUPPORTED  # a metric the stand-in does not serve
    n.nvmlGpmSampleFree(s1)
    n.nvmlGpmSampleFree(s2)


def test_a_change_between_samples_comes_out_time_weighted(sim: Sim) -> None:
    n = sim.nvml
    sim.update(_gpm_state(sm_util=0))
    n.nvmlInit()
    a, _ = sim.handles()
    s1, s2, s3 = (n.nvmlGpmSampleAlloc() for _ in range(3))
    n.nvmlGpmSampleGet(a, s1)
    time.sleep(0.05)
    n.nvmlGpmSampleGet(a, s2)  # the counters advanced at 0 % up to here
    sim.update(_gpm_state(sm_util=100))
    time.sleep(0.05)
    n.nvmlGpmSampleGet(a, s3)
    ids = [n.NVML_GPM_METRIC_SM_UTIL]
    assert _metrics(n, s1, s2, ids).metrics[0].value == pytest.approx(0)
    assert _metrics(n, s2, s3, ids).metrics[0].value == pytest.approx(100)
    whole = _metrics(n, s1, s3, ids).metrics[0].value
    assert 0 < whole < 100  # the mean over both intervals


@pytest.mark.parametrize("case", ["same_sample", "reversed", "other_device", "unfilled", "version", "too_many"])
def test_metrics_get_refuses_what_real_hardware_cannot_compute(sim: Sim, case: str) -> None:
    n = sim.nvml
    both = make_state(0, devices=[make_device(0, gpm=H100), make_device(1, gpm=H100)])
    sim.update(both)
    n.nvmlInit()
    a, b = sim.handles()
    s1, s2 = _two_samples(n, a, gap=0.01)
    ids = [n.NVML_GPM_METRIC_SM_UTIL]
    expected: type[Exception] = n.NVMLError_InvalidArgument
    if case == "same_sample":
        args = (s2, s2, ids, None)
    elif case == "reversed":
        args = (s2, s1, ids, None)
    elif case == "other_device":
        other = n.nvmlGpmSampleAlloc()
        n.nvmlGpmSampleGet(b, other)
        args = (s1, other, ids, None)
    elif case == "unfilled":
        args = (s1, n.nvmlGpmSampleAlloc(), ids, None)
    elif case == "version":
        args = (s1, s2, ids, 2)
        expected = n.NVMLError_ArgumentVersionMismatch
    else:
        args = (s1, s2, ids, None)
        mg = n.c_nvmlGpmMetricsGet_t()
        mg.version, mg.numMetrics, mg.sample1, mg.sample2 = 1, n.NVML_GPM_METRIC_MAX + 1, s1, s2
        with pytest.raises(expected):
            n.nvmlGpmMetricsGet(mg)
        return
    with pytest.raises(expected):
        _metrics(n, *args)


def test_per_metric_error_and_call_error_overrides(sim: Sim) -> None:
    n = sim.nvml
    sim.update(_gpm_state(metric_errors={"sm_occupancy": "UNKNOWN"}))
    n.nvmlInit()
    a, _ = sim.handles()
    s1, s2 = _two_samples(n, a, gap=0.01)
    sm, occ = _metrics(n, s1, s2, [n.NVML_GPM_METRIC_SM_UTIL, n.NVML_GPM_METRIC_SM_OCCUPANCY]).metrics[:2]
    assert (sm.nvmlReturn, occ.nvmlReturn) == (n.NVML_SUCCESS, n.NVML_ERROR_UNKNOWN)
    state = _gpm_state()
    state["devices"][0]["errors"] = {"nvmlGpmMetricsGet": "UNKNOWN", "nvmlGpmSampleGet": "GPU_IS_LOST"}
    sim.update(state)
    with pytest.raises(n.NVMLError_Unknown):
        _metrics(n, s1, s2, [n.NVML_GPM_METRIC_SM_UTIL])
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlGpmSampleGet(a, s1)


def test_mig_instance_samples(sim: Sim) -> None:
    n = sim.nvml
    sim.update(_gpm_state(instances={"1": {"sm_util": 30}, "2": {"sm_util": 90, "dram_bw_util": 10}}))
    n.nvmlInit()
    a, _ = sim.handles()
    values = {}
    for gi in (1, 2):
        s1, s2 = n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()
        n.nvmlGpmMigSampleGet(a, gi, s1)
        time.sleep(0.01)
        n.nvmlGpmMigSampleGet(a, gi, s2)
        values[gi] = _metrics(n, s1, s2, [n.NVML_GPM_METRIC_SM_UTIL]).metrics[0].value
    assert values == pytest.approx({1: 30, 2: 90})
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlGpmMigSampleGet(a, 5, n.nvmlGpmSampleAlloc())


def test_alloc_free_and_uninitialized(sim: Sim) -> None:
    n = sim.nvml
    with pytest.raises(n.NVMLError_Uninitialized):
        n.nvmlGpmSampleAlloc()
    n.nvmlInit()
    s = n.nvmlGpmSampleAlloc()
    n.nvmlGpmSampleFree(s)
    fn = n._nvmlGetFunctionPointer("nvmlGpmSampleFree")
    assert fn(None) == n.NVML_ERROR_INVALID_ARGUMENT


def test_omitted_symbols_are_function_not_found(
    sim: Sim, load_standin: Callable[[Path], ctypes.CDLL]
) -> None:
    n = sim.nvml
    load_standin(build_standin(omit=["nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet", "nvmlGpmMetricsGet"]))
    sim.update(_gpm_state())
    n.nvmlInit()
    a, _ = sim.handles()
    with pytest.raises(n.NVMLError_FunctionNotFound):
        n.nvmlGpmQueryDeviceSupport(a)
