"""Scenario files: a small, typed, validated timeline language that drives the stand-in NVML driver.

A scenario is data (YAML), never code. It names a fleet of GPUs, optional per-GPU overrides of the stand-in's
device defaults (``gpuwatchd.sim.state.make_device``), and a timeline of steps at scenario times (seconds from
the start). :func:`gpuwatchd.sim.player.state_at` turns a scenario and a time into a stand-in state dict
(``docs/sim-state.md``); the :class:`~gpuwatchd.sim.player.Player` writes it while time runs. The full format,
with examples, is in ``docs/scenarios.md``; in short::

    name: leak
    description: What the user should see.
    gpus: 1                      # default GPU count (``gpuwatchd sim --gpus N`` overrides it)
    loop: false                  # at the end of the timeline: hold the last state (false) or restart (true)
    duration: 1800               # optional cycle length for loop (default: when the last step ends)
    library: present             # "absent": the runner points the daemon at a directory without libnvidia-ml
    system: {driver_version: "550.54.14"}        # top-level state overrides
    devices:                     # per-GPU overrides: "all" (every GPU) then a GPU's slot number
      all: {name: NVIDIA RTX A5000, memory: {total: 24GiB}}
      0: {pci: {bus: 0x41}}
    processes:                   # optional generated population (fleet): stable pids, mild churn
      per_gpu: 256
    timeline:
      - at: 10
        set: {"devices[0].temperature": 81, "devices[*].clocks_event_reasons": 0x20}   # quote [..] in {..}
      - at: 10
        ramp: {path: "devices[0].processes.compute[pid=4242].used_memory", from: 1GiB, to: 22GiB, over: 1800}
      - at: 0
        add_process: {gpu: 0, pid: 4242, name: python, user: alice, used_memory: 1GiB}

Devices are addressed by **slot** (``devices[1]`` is the scenario's second GPU), which keeps its identity (UUID)
when it is removed and re-inserted at another NVML index. Validation errors name the file and the step:
``leak.yml: timeline[3].set: unknown field 'devices[0].memroy.used'``.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from gpuwatchd.config.files import InputFileError, missing, read_text_file, shown_path
from gpuwatchd.config.safe_yaml import load_yaml
from gpuwatchd.config.types import problem_lines, yaml_error_message
from gpuwatchd.sim.kmsg_text import kmsg_step_lines
from gpuwatchd.sim.scenario_fields import (
    OPEN_MAPS,
    FieldPath,
    Number,
    check_field,
    device_schema,
    format_validation_error,
    parse_path,
    parse_quantity,
)
from gpuwatchd.sim.series_step import SeriesSpec
from gpuwatchd.sim.standin_abi import MAX_SIM_GPUS

__all__ = ["FieldPath", "Scenario", "ScenarioError", "Step", "check_field", "load_scenario", "load_scenario_file",
           "parse_path", "parse_quantity", "scenario_from_dict", "scenario_names"]

SCENARIO_DIR = Path(__file__).parent / "scenarios"


class ScenarioError(Exception):
    """A scenario that cannot be used; ``str`` is one ``file: where: message`` line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(problem_lines(source, problems))


# --- the format ----------------------------------------------------------------------------------------------------


# Longest time a scenario can name (a step's time, a ramp, a period...): a year. Beyond, the player's time arithmetic
# leaves the range where floats resolve seconds.
MAX_SECONDS = 366 * 86400.0


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)


class RampSpec(_Model):
    """Linear from ``from`` to ``to`` over ``over`` seconds, then hold ``to``."""

    path: str
    from_: Number = Field(alias="from")
    to: Number
    over: float = Field(gt=0, le=MAX_SECONDS)


class PlateauSpec(_Model):
    """PyTorch caching-allocator shape: saturating warm-up growth to ``peak``, then flat with periodic spikes.

    The spikes (evaluation passes) go ``spike`` above the plateau for ``spike_len`` seconds every ``every``
    seconds and come back down, so the series is bounded: a leak detector must not fire on it.
    """

    path: str
    base: Number
    peak: Number
    warmup: float = Field(gt=0, le=MAX_SECONDS)
    spike: Number = 0
    every: float = Field(default=300.0, gt=0, le=MAX_SECONDS)
    spike_len: float = Field(default=20.0, ge=0, le=MAX_SECONDS)


class WaveSpec(_Model):
    """``mean + amplitude * sin(2 pi t / period)``: load that breathes, deterministic in t."""

    path: str
    mean: Number
    amplitude: Number
    period: float = Field(gt=0, le=MAX_SECONDS)


class ProcessSpec(_Model):
    gpu: int = Field(ge=0)
    pid: int = Field(gt=0, lt=32_768)  # below the kernel's default pid_max, so the daemon accepts it on any host
    kind: Literal["compute", "graphics"] = "compute"
    name: str = "python"
    user: str = "root"
    used_memory: Annotated[int | None, BeforeValidator(parse_quantity)] = None
    host_rss: Annotated[int | None, BeforeValidator(parse_quantity)] = None
    # The text of the process' /proc/PID/cgroup (docs/scenarios.md), e.g. "0::/system.slice/docker-<64 hex>.scope":
    # the container, pod or Slurm job it runs in. Unset: a host process (a login session's cgroup).
    cgroup: str | None = Field(default=None, max_length=4096)
    # what /proc says of the pid (sim/state.py): "gone" models a process that exited while the driver still holds
    # its memory (the daemon's resolver finds no /proc entry), "zombie" one its parent has not reaped
    host_state: Literal["live", "zombie", "gone"] = "live"
    # per-process utilization in percent (sim/procutil.py); None: the process has none
    sm_util: int | None = Field(default=None, ge=0, le=100)
    memory_util: int | None = Field(default=None, ge=0, le=100)
    encoder_util: int | None = Field(default=None, ge=0, le=100)
    decoder_util: int | None = Field(default=None, ge=0, le=100)


class RemoveProcessSpec(_Model):
    gpu: int = Field(ge=0)
    pid: int = Field(gt=0)


class InsertSpec(_Model):
    gpu: int = Field(ge=0)
    index: int = Field(ge=0)  # NVML enumeration position after insertion (clamped to the list length)


class EventSpec(_Model):
    gpu: int = Field(ge=0)
    type: Literal["xid", "sbe", "dbe", "pstate", "clock", "power_source"] = "xid"
    data: int = 0


class XidSpec(_Model):
    gpu: int = Field(ge=0)
    code: int = Field(ge=0)


class PopulationSpec(_Model):
    """A generated process population per GPU with stable pids and round-robin churn (fleet scenarios)."""

    per_gpu: int = Field(ge=1, le=4096)
    pid_start: int = Field(default=8_000, gt=1, lt=32_768)
    churn_every: float = Field(default=30.0, ge=0.1, le=MAX_SECONDS)  # seconds between churn ticks
    churn_count: int = Field(default=2, ge=0, le=4096)  # processes replaced per GPU per tick
    names: tuple[str, ...] = ("python",)
    users: tuple[str, ...] = ("root",)
    memory_min: Annotated[int, BeforeValidator(parse_quantity)] = 64 << 20
    memory_max: Annotated[int, BeforeValidator(parse_quantity)] = 256 << 20


class ScenarioDoc(_Model):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = Field(min_length=1)
    gpus: int = Field(default=1, ge=0, le=MAX_SIM_GPUS)
    loop: bool = False
    duration: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    library: Literal["present", "absent"] = "present"
    system: dict[str, Any] = Field(default_factory=dict)
    devices: dict[str | int, dict[str, Any]] = Field(default_factory=dict)
    processes: PopulationSpec | None = None
    timeline: list[dict[str, Any]] = Field(default_factory=list)


# --- the validated, immutable scenario -----------------------------------------------------------------------------

Action = Literal[
    "set", "ramp", "plateau", "wave", "add_process", "remove_process", "lose", "remove", "insert", "event", "xid",
    "kmsg", "series",
]
ACTIONS: tuple[str, ...] = Action.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Step:
    """One timeline entry, validated; ``order`` is its position in the file (ties at one time keep file order)."""

    at: float
    order: int
    action: Action
    values: tuple[tuple[FieldPath, Any], ...] = ()  # set
    path: FieldPath | None = None  # ramp / plateau / wave
    spec: Any = None  # the action's typed payload
    gpu: int | None = None  # device-scoped actions

    @property
    def end(self) -> float:
        """When the step's effect stops changing."""
        if isinstance(self.spec, RampSpec):
            return self.at + self.spec.over
        if isinstance(self.spec, PlateauSpec):
            return self.at + self.spec.warmup
        if isinstance(self.spec, SeriesSpec):
            return self.at + self.spec.span
        return self.at


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    gpus: int
    loop: bool
    duration: float  # cycle length (loop) / time after which nothing changes (hold)
    library: Literal["present", "absent"]
    system: dict[str, Any]
    devices: dict[str | int, dict[str, Any]]
    population: PopulationSpec | None
    steps: tuple[Step, ...]
    source: str = "<scenario>"
    referenced_slots: frozenset[int] = field(default_factory=frozenset)

    def with_gpus(self, n: int) -> Scenario:
        """The same scenario on ``n`` GPUs (``--gpus``); the timeline must not address a GPU past ``n``."""
        if not 0 <= n <= MAX_SIM_GPUS:
            raise ScenarioError(self.source, [f"--gpus {n}: must be between 0 and {MAX_SIM_GPUS}"])
        missing = sorted(s for s in self.referenced_slots if s >= n)
        if missing:
            raise ScenarioError(
                self.source,
                [
                    f"--gpus {n}: scenario {self.name!r} drives devices[{missing[-1]}], so it needs at least "
                    f"{missing[-1] + 1} GPUs"
                ],
            )
        population = _population_problem(self.population, n)
        if population is not None:
            raise ScenarioError(self.source, [f"--gpus {n}: {population}"])
        return replace(self, gpus=n)


def _step(i: int, raw: Any, schema: dict[str, Any]) -> Step:
    if not isinstance(raw, dict):
        raise ValueError("expected a mapping with 'at' and one action")
    if "at" not in raw:
        raise ValueError("missing 'at' (seconds from the start)")
    at = raw["at"]
    if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at <= MAX_SECONDS:  # also NaN
        raise ValueError(f"at: expected seconds >= 0 and at most {MAX_SECONDS:g}, got {at!r}")
    actions = [k for k in raw if k != "at"]
    unknown = [k for k in actions if k not in ACTIONS]
    if unknown:
        raise ValueError(f"unknown action {unknown[0]!r} (one of: {', '.join(ACTIONS)})")
    if len(actions) != 1:
        raise ValueError(f"expected exactly one action, got {actions or 'none'}")
    action: Action = actions[0]
    body = raw[action]
    base = functools.partial(Step, float(at), i, action)
    if action == "set":
        if not isinstance(body, dict) or not body:
            raise ValueError("set: expected a mapping of field path -> value")
        values = []
        for text, value in body.items():
            try:
                fp = parse_path(str(text))
                values.append((fp, check_field(fp, value, schema)))
            except ValueError as e:
                raise ValueError(f"set: {e}") from None
        return base(values=tuple(values))
    if action == "kmsg":  # kernel-log lines into the sim's ring (sim/kmsg_replay.py, docs/kernel-log.md)
        return base(spec=kmsg_step_lines(body))
    if action in ("lose", "remove"):
        if isinstance(body, bool) or not isinstance(body, int) or body < 0:
            raise ValueError(f"{action}: expected a GPU slot number, got {body!r}")
        return base(gpu=body)
    models: dict[str, type[BaseModel]] = {
        "ramp": RampSpec,
        "plateau": PlateauSpec,
        "wave": WaveSpec,
        "add_process": ProcessSpec,
        "remove_process": RemoveProcessSpec,
        "insert": InsertSpec,
        "event": EventSpec,
        "xid": XidSpec,
        "series": SeriesSpec,  # sim/series_step.py
    }
    model: type[BaseModel] = models[action]
    try:
        spec = model.model_validate(body)
    except ValidationError as e:
        raise ValueError("; ".join(f"{action}.{line}" for line in format_validation_error(e))) from None
    if isinstance(spec, RampSpec | PlateauSpec | WaveSpec | SeriesSpec):
        try:
            fp = parse_path(spec.path)
            check_field(fp, 0, schema, numeric=True)
        except ValueError as e:
            raise ValueError(f"{action}.path: {e}") from None
        return base(path=fp, spec=spec)
    gpu = getattr(spec, "gpu", None)
    return base(spec=spec, gpu=gpu)


def _slots_of(step: Step) -> set[int]:
    out = {step.gpu} if step.gpu is not None else set()
    paths = [fp for fp, _ in step.values] + ([step.path] if step.path else [])
    out.update(fp.slot for fp in paths if isinstance(fp.slot, int))
    return out


# Every number a scenario writes is finite and at most this in size (the stand-in's widest field is 64 bits): one
# check over the whole document at load, so no later arithmetic (a ramp, round(), a size in bytes) meets .inf or a
# 1e308 and ends in an OverflowError while the sim runs.
MAX_NUMBER = float(2**64)
# A looping scenario's cycle lasts at least this: per cycle the player walks the timeline, and a 1e-300 s cycle
# made it walk forever before the first state was served.
MIN_LOOP_SECONDS = 1.0
# Generated processes in all (per_gpu x gpus): each costs ~20 us per state written; 16384 is four fleet scenarios
# (a 16-GPU node with 256 each is 4096) and every pid stays below pid_max (32768) from the default pid_start.
MAX_POPULATION = 16_384
PID_MAX = 32_768


def _numbers(node: Any, where: str, out: list[str], budget: list[int]) -> None:
    """Problems of the numbers in ``node`` (non-finite, too large), at most 10 (``budget``)."""
    if budget[0] <= 0:
        return
    if isinstance(node, dict):
        for k, v in node.items():
            _numbers(v, f"{where}.{k}" if where else str(k), out, budget)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _numbers(v, f"{where}[{i}]", out, budget)
    elif isinstance(node, float | int) and not isinstance(node, bool) and (
            not math.isfinite(node) or abs(node) > MAX_NUMBER):
        shown = repr(node) if isinstance(node, float) else f"an integer of {node.bit_length()} bits"
        out.append(f"{where or '(top level)'}: {shown} is not a finite number of at most 2**64")
        budget[0] -= 1


def _population_problem(pop: PopulationSpec | None, gpus: int) -> str | None:
    if pop is None:
        return None
    total = pop.per_gpu * gpus
    most = min(MAX_POPULATION, PID_MAX - pop.pid_start)
    if total > most:
        return (f"processes.per_gpu: {pop.per_gpu} on {gpus} GPUs is {total} processes; at most {most} in all "
                f"(pids {pop.pid_start}..{PID_MAX - 1})")
    return None


def scenario_from_dict(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate a parsed YAML document into a :class:`Scenario`."""
    if not isinstance(data, dict):
        raise ScenarioError(source, ["(top level): expected a mapping"])
    bad_numbers: list[str] = []
    _numbers(data, "", bad_numbers, [10])
    if bad_numbers:
        raise ScenarioError(source, bad_numbers)
    try:
        doc = ScenarioDoc.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(source, format_validation_error(e)) from None
    schema = device_schema()
    problems: list[str] = []
    steps: list[Step] = []
    for i, raw in enumerate(doc.timeline):
        try:
            steps.append(_step(i, raw, schema))
        except ValueError as e:
            problems.append(
                f"timeline[{i}].{e}" if str(e).split(":")[0].split(".")[0] in ACTIONS else f"timeline[{i}]: {e}"
            )
    for key, value in doc.system.items():
        try:
            check_field(FieldPath(key, None, (key,)), value, schema)
        except ValueError as e:
            problems.append(f"system: {e}")
    for slot, overrides in doc.devices.items():
        if slot != "all" and not (isinstance(slot, int) and slot >= 0):
            problems.append(f"devices: key {slot!r} must be 'all' or a GPU slot number")
            continue
        problems.extend(_check_overrides(f"devices.{slot}", overrides, schema))
    if problems:
        raise ScenarioError(source, problems)
    slots: set[int] = set()
    for s in steps:
        slots |= _slots_of(s)
    slots.update(k for k in doc.devices if isinstance(k, int))
    ends = [s.end for s in steps]
    if doc.processes is not None:
        ends.append(doc.processes.churn_every)
    duration = doc.duration or max(ends, default=0.0)
    if doc.loop and duration < MIN_LOOP_SECONDS:
        raise ScenarioError(source, [f"loop: true needs a duration of at least {MIN_LOOP_SECONDS:g} s (or a timeline "
                                     f"that spans that long), got {duration:g}"])
    population = _population_problem(doc.processes, doc.gpus)
    if population is not None:
        raise ScenarioError(source, [population])
    scen = Scenario(
        name=doc.name,
        description=" ".join(doc.description.split()),
        gpus=doc.gpus,
        loop=doc.loop,
        duration=duration,
        library=doc.library,
        system=dict(doc.system),
        devices={k: _normalise(v) for k, v in doc.devices.items()},
        population=doc.processes,
        steps=tuple(sorted(steps, key=lambda s: (s.at, s.order))),
        source=source,
        referenced_slots=frozenset(slots),
    )
    missing = sorted(s for s in slots if s >= doc.gpus)
    if missing:
        raise ScenarioError(source, [f"gpus: {doc.gpus}, but the scenario drives devices[{missing[-1]}]"])
    return scen


def _normalise(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return parse_quantity(value)


def _check_overrides(where: str, overrides: Any, schema: dict[str, Any], prefix: str = "") -> list[str]:
    if not isinstance(overrides, dict):
        return [f"{where}: expected a mapping of device fields"]
    problems = []
    for key, value in overrides.items():
        text = f"{prefix}{key}"
        node: Any = schema
        for part in text.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(value, dict) and key not in OPEN_MAPS and key != "processes":
            problems.extend(_check_overrides(where, value, schema, prefix=f"{text}."))
            continue
        try:
            check_field(parse_path(f"devices[0].{text}"), _normalise(value), schema)
        except ValueError as e:
            problems.append(f"{where}: {str(e).replace('devices[0].', '')}")
    return problems


# What a too-large scenario file should become: a long trace belongs in a ``series`` step reading a file of values
# (gpuwatchd/sim/series_step.py), which takes up to 32 MiB, not in thousands of timeline steps.
SERIES_HINT = (
    "a long recorded trace goes in a series step with a file of values, one per line: "
    "{at: 0, series: {path: \"devices[0].memory.used\", every: 1, file: trace.txt}} (docs/scenarios.md)"
)


def load_scenario_file(path: Path) -> Scenario:
    """Load and validate one scenario file."""
    src = shown_path(path.name)
    try:
        text = read_text_file(path)
    except InputFileError as e:  # the whole path: "zero: not a regular file" would not say which file
        reason = str(e)
        if reason.startswith("file too large"):  # a long recorded trace written out as timeline steps
            reason += (f"; {SERIES_HINT}")
        raise ScenarioError(shown_path(path), [reason]) from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        raise ScenarioError(src, [yaml_error_message(e)]) from None
    return scenario_from_dict(data, src)


def scenario_names() -> list[str]:
    """Names of the built-in scenarios, sorted."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yml"))


SCENARIO_SUFFIXES = (".yml", ".yaml")


def looks_like_path(name_or_path: str | Path) -> bool:
    """True when ``name_or_path`` names a file rather than a built-in scenario: it has a directory part (``./idle``,
    ``/tmp/x``) or a YAML suffix. A bare word is a scenario name, whatever the current directory holds: a leftover
    ``./idle`` state dir must not shadow the built-in ``idle``."""
    if isinstance(name_or_path, Path):
        return True
    text = name_or_path
    return "/" in text or os.sep in text or text in (".", "..") or text.endswith(SCENARIO_SUFFIXES)


def builtin_path(name: str) -> Path | None:
    """The file of the built-in scenario ``name``; None when there is none of that name."""
    if name not in scenario_names():
        return None
    return SCENARIO_DIR / f"{name}.yml"


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A built-in scenario by name (``leak``) or a scenario file by path (``./leak.yml``, ``dir/x``; a ``Path``)."""
    if looks_like_path(name_or_path):
        return load_scenario_file(Path(name_or_path))
    name = str(name_or_path)
    builtin = builtin_path(name)
    if builtin is None:
        known = ", ".join(scenario_names())
        hint = f"; for the file {name!r} in this directory write ./{name}" if not missing(name) else ""
        raise ScenarioError(shown_path(name), [f"no such scenario (built-in: {known}){hint}"])
    return load_scenario_file(builtin)
