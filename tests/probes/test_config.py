"""``probes:`` config: defaults within the duty-cycle goal, out-of-range values named by key path."""

from __future__ import annotations

import pytest

from gpuwatchd.config.loader import ConfigError, config_from_dict


def test_defaults() -> None:
    cfg = config_from_dict({}).probes
    assert cfg.enabled and cfg.interval == 3600 and cfg.idle_for == 300 and cfg.duty_cycle == 0.01
    assert cfg.selected() == ["gemm", "memory", "pcie", "launch"]
    assert config_from_dict({}).rules.probe.degraded_ratio == 0.8


@pytest.mark.parametrize(
    ("probes", "message"),
    [
        ({"duty_cycle": 2}, "probes.duty_cycle: Input should be less than or equal to 1"),
        ({"deadline": "1s"}, "probes.deadline: Input should be greater than or equal to 5"),
        ({"max_memory_share": 0.95}, "probes.max_memory_share: Input should be less than or equal to 0.9"),
        ({"interval": "10m", "idle_for": "1h"}, "probes: idle_for must not exceed interval"),
        ({"gemm": False, "memory": False, "pcie": False, "launch": False}, "every probe is switched off"),
        ({"gemm_n": 10}, "probes.gemm_n: Input should be greater than or equal to 64"),
    ],
)
def test_out_of_range_values_are_refused(probes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict({"probes": probes})
    assert any(message in p for p in e.value.problems), e.value.problems


def test_degraded_ratio_range() -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict({"rules": {"probe": {"degraded_ratio": 1.5}}})
    assert "rules.probe.degraded_ratio: Input should be less than 1" in str(e.value)
