"""Whether every state a scenario's timeline reaches can be written for the stand-in driver, checked before it runs.

The scenario format checks each value's type; the state writer (``sim/state.py``) checks ranges and lengths the C
side can hold (a temperature in 0..255, a 79-byte driver version, a memory size within 64 bits). A value out of those
would only fail when the player writes it, minutes into a run and as a traceback. So the states at every instant
where a timeline value is extreme (a step's start and end, a wave's crest and trough, a plateau's spike) are built
and encoded once at load, and the first failure is a :class:`ScenarioError` naming the time and the field.
"""

from __future__ import annotations

from gpuwatchd.sim.player import state_at
from gpuwatchd.sim.scenario import PlateauSpec, Scenario, ScenarioError, WaveSpec
from gpuwatchd.sim.series_step import SeriesSpec
from gpuwatchd.sim.state import encode_state

# Instants checked at most: a scenario has tens of steps; a generated one with thousands is checked at its first.
MAX_INSTANTS = 400


def check_states(scen: Scenario) -> None:
    """Raise :class:`ScenarioError` if a state the scenario reaches cannot be written for the stand-in."""
    instants = {0.0, scen.duration}
    for step in scen.steps:
        instants.update((step.at, step.end))
        spec = step.spec
        if isinstance(spec, WaveSpec):
            instants.update(step.at + spec.period * share for share in (0.25, 0.75))
        elif isinstance(spec, PlateauSpec) and spec.spike_len > 0:
            instants.add(step.at + spec.warmup + spec.every - spec.spike_len / 2)
        elif isinstance(spec, SeriesSpec) and spec.values:
            # a series' extremes, wherever they fall in it (a 999 C in the middle was a traceback mid-run)
            values = spec.values
            for i in (values.index(min(values)), values.index(max(values))):
                instants.add(step.at + (i + 0.5) * spec.every)
    for t in sorted(instants)[:MAX_INSTANTS]:
        try:
            encode_state(state_at(scen, t))
        except ValueError as e:
            raise ScenarioError(scen.source, [f"at t={t:g}s: {e}"]) from None
