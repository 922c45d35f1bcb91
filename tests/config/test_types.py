"""The sections' building blocks on msgspec: secrets, the keys a file gave, copies with changes, dumps."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gpuwatchd.config.loader import Config, config_from_dict
from gpuwatchd.config.types import SecretStr, ValidationError, dump, fields_set, replace, validate
from gpuwatchd.notify.config import NotifyConfig
from gpuwatchd.probes.config import ProbesConfig, sim_probes
from gpuwatchd.rules.config import LeakRule

URL = "https://hooks.example.com/T0/B0/SECRETpart"


def test_a_secret_is_masked_but_kept() -> None:
    s = SecretStr("hunter2-token")
    assert str(s) == "**********" and repr(s) == "SecretStr('**********')"
    assert s.get_secret_value() == "hunter2-token"
    assert s == SecretStr("hunter2-token") and s != SecretStr("other")
    cfg = validate(NotifyConfig, {"receivers": [{"name": "a", "type": "slack", "url": URL,
                                                 "headers": {"X-Token": "SECRETheader"}}]})
    rc = cfg.receivers[0]
    assert rc.url.get_secret_value() == URL and rc.headers["X-Token"].get_secret_value() == "SECRETheader"
    shown = [repr(cfg), str(cfg), msgspec.json.encode(dump(cfg)).decode()]
    assert not [t for t in shown if "SECRET" in t]


def test_the_keys_a_file_gave_are_told_from_defaults() -> None:
    cfg = config_from_dict({"state_dir": "/var/lib/gpuwatchd", "attribution": {"kubernetes": {"interval": "5s"}}})
    assert fields_set(cfg) == {"state_dir", "attribution"}  # the default's value, given: still given
    assert fields_set(cfg.attribution.kubernetes) == {"interval"}
    assert fields_set(cfg.nvml) == frozenset()
    assert fields_set(Config()) == frozenset()


def test_replace_counts_the_changed_keys_as_given_and_does_not_check_again() -> None:
    probes = validate(ProbesConfig, {"idle_for": "10m"})
    # The sim's schedule (interval 2 min) with the file's idle_for (10 min): the copy is the caller's business,
    # as pydantic's model_copy was; validating it would refuse it.
    sim = sim_probes(probes, set(fields_set(probes)))
    assert (sim.interval, sim.idle_for) == (120.0, 600.0)
    cfg = replace(Config(), state_dir=Path("/tmp/x"))
    assert fields_set(cfg) == {"state_dir"} and cfg.state_dir == Path("/tmp/x")
    with pytest.raises(TypeError, match="no key 'nope'"):
        replace(Config(), nope=1)


def test_for_is_read_as_written_and_by_its_attribute_name() -> None:
    assert validate(LeakRule, {"for": "2m"}).for_ == 120.0
    assert validate(LeakRule, {"for_": "3m"}).for_ == 180.0


def test_every_problem_in_lists_and_sections_at_once() -> None:
    with pytest.raises(ValidationError) as e:
        validate(Config, {"notify": {"receivers": [{"name": "ok", "type": "slack", "url": URL},
                                                   {"name": "bad name", "type": "sms", "url": URL}]},
                          "rules": {"leak": {"for": "soon", "noise_factor": float("nan")}}, "extra": 1})
    assert sorted(e.value.problems) == [
        "extra: Extra inputs are not permitted",
        "notify.receivers[1].name: String should match pattern '^[A-Za-z0-9_.\\-]+$'",
        "notify.receivers[1].type: Input should be 'slack', 'discord', 'teams', 'mattermost', 'webhook',"
        " 'alertmanager' or 'ntfy'",
        "rules.leak.for: expected a duration like 30s, 5m or 1h, got 'soon'",
        "rules.leak.noise_factor: Input should be a finite number",
    ]


def test_a_section_built_in_code_is_checked_too() -> None:
    with pytest.raises(ValueError, match="finite"):
        LeakRule(noise_factor=float("inf"))
    with pytest.raises(ValueError, match="min_span must not exceed window"):
        LeakRule(window=60.0, min_span=600.0)
