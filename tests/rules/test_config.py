"""``rules:`` section: Prometheus-style ``for``, durations, defaults, and errors that name the key path."""

from __future__ import annotations

import pytest
import yaml

from gpuwatchd.config.loader import ConfigError, config_from_dict
from gpuwatchd.rules.config import RulesConfig


def load(text: str) -> RulesConfig:
    return config_from_dict(yaml.safe_load(text)).rules


def test_defaults() -> None:
    r = RulesConfig()
    assert r.resolved_retention == 900.0 and r.expected_gpu_count is None
    assert r.leak.for_ == 300.0 and r.throttle.for_ == 60.0 and r.xid.for_ == 0.0 and r.presence.for_ == 0.0
    assert r.xid.resolve_after == 3600.0 and not r.throttle.sw_power_cap and r.ecc.retired_pages_max == 63


def test_yaml_with_for_and_durations() -> None:
    r = load("""
rules:
  resolved_retention: 5m
  expected_gpu_count: 4
  throttle: {for: 2m, sw_power_cap: true, keep_firing_for: 30s}
  leak: {window: 40m, min_span: 15m, horizon: 12h, enabled: true}
  xid: {resolve_after: 2h, ignore: [43, 45]}
  temperature: {margin_celsius: 3, clear_margin_celsius: 6}
""")
    assert r.resolved_retention == 300.0 and r.expected_gpu_count == 4
    assert r.throttle.for_ == 120.0 and r.throttle.sw_power_cap and r.throttle.keep_firing_for == 30.0
    assert (r.leak.window, r.leak.min_span, r.leak.horizon) == (2400.0, 900.0, 43200.0)
    assert r.xid.resolve_after == 7200.0 and r.xid.ignore == (43, 45)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("rules: {throttle: {for: soon}}", "rules.throttle.for: expected a duration"),
        ("rules: {leak: {windwo: 5m}}", "rules.leak.windwo: Extra inputs are not permitted"),
        ("rules: {expected_gpu_count: 0}", "rules.expected_gpu_count:"),
        ("rules: {leak: {min_span: 2h}}", "rules.leak: min_span must not exceed window"),
        ("rules: {temperature: {margin_celsius: 9}}", "clear_margin_celsius must be >= margin_celsius"),
    ],
)
def test_errors_name_the_key(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(text)
    assert where in str(e.value)
