"""The scenario format: paths, quantities, and validation errors that name the file and the step."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from gpuwatchd.sim.scenario import (
    ScenarioError,
    load_scenario,
    load_scenario_file,
    parse_path,
    parse_quantity,
    scenario_from_dict,
)

HEAD = "name: t\ndescription: test scenario\ngpus: 2\n"


def load_text(tmp_path: Path, text: str, name: str = "leak.yml") -> object:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return load_scenario_file(path)


def problems_of(tmp_path: Path, text: str, name: str = "leak.yml") -> list[str]:
    with pytest.raises(ScenarioError) as info:
        load_text(tmp_path, text, name)
    return str(info.value).splitlines()


@pytest.mark.parametrize(
    ("text", "slot", "keys"),
    [
        ("devices[0].memory.used", 0, ("memory", "used")),
        ("devices[*].temperature", "*", ("temperature",)),
        ("devices[3].processes.compute[pid=4242].used_memory", 3,
         ("processes", "compute", ("pid", 4242), "used_memory")),
        ("devices[1].fans[0]", 1, ("fans", 0)),
        ("devices[1].delays_ms.*", 1, ("delays_ms", "*")),
        ("init_error", None, ("init_error",)),
    ],
)
def test_parse_path(text: str, slot: object, keys: tuple[object, ...]) -> None:
    fp = parse_path(text)
    assert (fp.slot, fp.keys) == (slot, keys)


@pytest.mark.parametrize(
    "text", ["devices[x].memory", "devices[0]", "devices.memory", "memory.used", "devices[0]memory", ""])
def test_parse_path_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"field path|unknown field|devices\[N\]"):
        parse_path(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("22GiB", 22 * 2**30), ("1.5 GB", 1_500_000_000), ("300MiB", 300 * 2**20), ("12", "12"), (7, 7), ("Xorg", "Xorg")],
)
def test_parse_quantity(value: object, expected: object) -> None:
    assert parse_quantity(value) == expected


BAD = [
    pytest.param(
        "timeline:\n- {at: 0, set: {'devices[0].temperature': 50}}\n- {at: 1, set: {'devices[0].temperature': 51}}\n"
        "- {at: 2, set: {'devices[0].temperature': 52}}\n- {at: 3, set: {'devices[0].memroy.used': 5}}\n",
        "leak.yml: timeline[3].set: unknown field 'devices[0].memroy.used'",
        id="unknown-field",
    ),
    pytest.param("timeline:\n- {at: 0, sett: {}}\n", "leak.yml: timeline[0]: unknown action 'sett'",
                 id="unknown-action"),
    pytest.param("timeline:\n- {at: 0, lose: 0, remove: 0}\n", "leak.yml: timeline[0]: expected exactly one action",
                 id="two-actions"),
    pytest.param("timeline:\n- {lose: 0}\n", "leak.yml: timeline[0]: missing 'at'", id="no-at"),
    pytest.param("timeline:\n- {at: -1, lose: 0}\n", "leak.yml: timeline[0]: at: expected seconds >= 0",
                 id="negative-at"),
    pytest.param("timeline:\n- {at: 0, ramp: {path: 'devices[0].temperature', from: 1, to: 2}}\n",
                 "leak.yml: timeline[0].ramp.over: Field required", id="ramp-no-over"),
    pytest.param("timeline:\n- {at: 0, ramp: {path: 'devices[0].name', from: 1, to: 2, over: 5}}\n",
                 "leak.yml: timeline[0].ramp.path: devices[0].name: not a numeric field", id="ramp-text-field"),
    pytest.param("timeline:\n- {at: 0, ramp: {path: 'devices[0].fans[pid=3]', from: 1, to: 2, over: 5}}\n",
                 "[pid=N] selects a process", id="pid-selector-outside-processes"),
    pytest.param("timeline:\n- {at: 0, set: {'devices[0].lost': 'yes'}}\n",
                 "leak.yml: timeline[0].set: devices[0].lost: expected bool, got 'yes'", id="wrong-type"),
    pytest.param("timeline:\n- {at: 0, set: {'devices[0].delays_ms.getPower': 5}}\n",
                 "'getPower' is not an NVML call name", id="bad-symbol"),
    pytest.param("timeline:\n- {at: 0, set: {'devices[0].errors.nvmlDeviceGetPowerUsage': 3}}\n",
                 "expected str", id="error-code-not-a-name"),
    pytest.param("timeline:\n- {at: 0, add_process: {gpu: 0, pid: 40000}}\n",
                 "leak.yml: timeline[0].add_process.pid: Input should be less than 32768", id="pid-max"),
    pytest.param("timeline:\n- {at: 0, lose: 5}\n", "leak.yml: gpus: 2, but the scenario drives devices[5]",
                 id="slot-past-gpus"),
    pytest.param("devices:\n  all: {temprature: 40}\n", "leak.yml: devices.all: unknown field 'temprature'",
                 id="override-unknown"),
    pytest.param("devices:\n  0: {memory: {totl: 1GiB}}\n", "leak.yml: devices.0: unknown field 'memory.totl'",
                 id="override-nested-unknown"),
    pytest.param("devices:\n  gpu0: {temperature: 40}\n", "devices: key 'gpu0' must be 'all' or a GPU slot number",
                 id="override-bad-slot"),
    pytest.param("system: {driver: x}\n", "leak.yml: system: unknown field 'driver'", id="system-unknown"),
    pytest.param("gpu: 3\n", "leak.yml: gpu: Extra inputs are not permitted", id="top-level-typo"),
    pytest.param("loop: true\n", "loop: true needs a duration", id="loop-without-duration"),
    pytest.param("timeline:\n- {at: 0, set: {init_eror: X}}\n", "unknown field 'init_eror'", id="top-level-field"),
]


@pytest.mark.parametrize(("body", "message"), BAD)
def test_validation_errors_name_file_and_step(tmp_path: Path, body: str, message: str) -> None:
    problems = problems_of(tmp_path, HEAD + body)
    assert any(message in p for p in problems), problems
    assert all(p.startswith("leak.yml: ") for p in problems)


def test_every_bad_step_is_reported_at_once(tmp_path: Path) -> None:
    body = "timeline:\n- {at: 0, sett: {}}\n- {at: 1, lose: 0}\n- {at: 2, set: {'devices[9].nope': 1}}\n"
    problems = problems_of(tmp_path, HEAD + body)
    assert [p.split(": ")[1].split(".")[0] for p in problems] == ["timeline[0]", "timeline[2]"]


def test_invalid_yaml_names_line(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, HEAD + "timeline: [\n", name="broken.yml")
    assert problems[0].startswith("broken.yml: line ")
    assert "invalid YAML" in problems[0]


def test_bad_name_and_missing_description(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, "name: Bad Name\ngpus: 1\n")
    assert any(p.startswith("leak.yml: name: ") for p in problems)
    assert any(p.startswith("leak.yml: description: Field required") for p in problems)


def test_valid_scenario_normalises(tmp_path: Path) -> None:
    scen = load_text(tmp_path, HEAD + dedent("""\
        loop: true
        devices:
          all: {memory: {total: 24GiB}}
        timeline:
          - {at: 30, set: {'devices[1].temperature': 80}}
          - {at: 10, ramp: {path: 'devices[0].processes.compute[pid=7].used_memory', from: 1GiB, to: 2GiB, over: 60}}
          - {at: 10, add_process: {gpu: 0, pid: 7, used_memory: 1GiB}}
        """))
    assert scen.devices["all"]["memory"]["total"] == 24 * 2**30  # type: ignore[attr-defined]
    # Sorted by time, file order kept among equal times; the cycle ends when the ramp does.
    assert [(s.at, s.action) for s in scen.steps] == [(10, "ramp"), (10, "add_process"), (30, "set")]  # type: ignore[attr-defined]
    assert scen.duration == 70  # type: ignore[attr-defined]
    assert scen.referenced_slots == {0, 1}  # type: ignore[attr-defined]


def test_with_gpus_refuses_too_few_for_the_timeline() -> None:
    scen = load_scenario("egpu-unplug")
    message = r"--gpus 1: scenario 'egpu-unplug' drives devices\[1\], so it needs at least 2"
    with pytest.raises(ScenarioError, match=message):
        scen.with_gpus(1)
    assert scen.with_gpus(4).gpus == 4


def test_unknown_scenario_lists_builtins() -> None:
    with pytest.raises(ScenarioError, match=r"no such scenario \(built-in: .*egpu-unplug.*xid-storm"):
        load_scenario("leek")


def test_not_a_mapping() -> None:
    with pytest.raises(ScenarioError, match=r"x.yml: \(top level\): expected a mapping"):
        scenario_from_dict(["a"], "x.yml")


def test_documented_examples_are_valid_scenarios() -> None:
    import textwrap

    import yaml

    from gpuwatchd.sim import scenario as module

    docs = (Path(__file__).resolve().parents[2] / "docs" / "scenarios.md").read_text(encoding="utf-8")
    block = docs.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert scenario_from_dict(yaml.safe_load(block), "docs/scenarios.md").name == "leak"
    assert module.__doc__ is not None
    example = module.__doc__.split("in short::\n\n", 1)[1].split("\n\nDevices", 1)[0]
    scen = scenario_from_dict(yaml.safe_load(textwrap.dedent(example)), "scenario.py docstring")
    assert {s.action for s in scen.steps} == {"set", "ramp", "add_process"}


def test_too_large_scenario_points_to_a_series_file(tmp_path: Path) -> None:
    # A 40 min, 1 s trace written as timeline steps is far past the 256 KiB cap: the error names the way that works.
    steps = "".join(f"  - {{at: {t}, set: {{devices[0].memory.used: {1000 + t}MiB}}}}\n" for t in range(2400 * 4))
    lines = problems_of(tmp_path, HEAD + "timeline:\n" + steps)
    assert "file too large" in lines[-1] and "at most 256 KiB" in lines[-1]
    assert "series step with a file" in lines[-1] and "file: trace.txt" in lines[-1]
    # ... and that way loads: the same trace as a series step reading a file of values.
    (tmp_path / "trace.txt").write_text("".join(f"{1000 + t}MiB\n" for t in range(2400)), encoding="utf-8")
    trace = tmp_path / "trace.txt"
    sc = load_text(tmp_path, HEAD + "timeline:\n"
                   f"  - {{at: 0, series: {{path: \"devices[0].memory.used\", every: 1, file: \"{trace}\"}}}}\n")
    assert sc is not None
