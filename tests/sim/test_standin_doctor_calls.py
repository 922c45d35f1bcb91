"""The stand-in calls ``gpuwatchd doctor`` adds: persistence mode, default power limit, the RM mismatch at init."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from gpuwatchd.sim.state import make_device, make_state

if TYPE_CHECKING:
    from conftest import Sim


def test_persistence_and_default_limit(sim: Sim) -> None:
    n = sim.nvml
    devices = [make_device(0, power_default_limit_mw=320000), make_device(1, persistence_mode=0)]
    sim.update(make_state(0, devices=devices))
    n.nvmlInit()
    a, b = sim.handles()
    assert n.nvmlDeviceGetPersistenceMode(a) == n.NVML_FEATURE_ENABLED
    assert n.nvmlDeviceGetPersistenceMode(b) == n.NVML_FEATURE_DISABLED
    assert n.nvmlDeviceGetPowerManagementDefaultLimit(a) == 320000
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetPowerManagementDefaultLimit(b)  # not in the state: N/A, as on boards without the reading


def test_unset_persistence_reads_not_supported(sim: Sim) -> None:
    n = sim.nvml
    sim.update(make_state(0, devices=[make_device(0, persistence_mode=None)]))
    n.nvmlInit()
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetPersistenceMode(n.nvmlDeviceGetHandleByIndex(0))


def test_driver_library_mismatch_fails_init(sim: Sim) -> None:
    n = sim.nvml
    sim.update(make_state(1, init_error="LIB_RM_VERSION_MISMATCH"))
    with pytest.raises(n.NVMLError_LibRmVersionMismatch) as e:
        n.nvmlInit()
    assert e.value.value == 18  # nvml.h NVML_ERROR_LIB_RM_VERSION_MISMATCH
