"""The simulation's side of the probes: faults per simulated GPU, and mapping a CPU run onto that GPU.

``gpuwatchd sim`` (and tests) build a :class:`SimProbes` over the stand-in state file; ``gpuwatchd run`` never
does, so nothing here can touch a real probe. Faults come from ``devices[N]._probe`` in the state (scenario
files set them like any device field; the C stand-in ignores keys starting with ``_``).

A CPU run measures the CPU, whose speed moves with the machine's load, so the sim maps each performance figure
onto the simulated GPU: the first raw figure of a measure (pcie: what the GPU's link should give, x0.9) is that
GPU's nominal figure, and every later run reports nominal x the injected factor. Healthy runs thus never look
degraded on a busy machine, and an injected factor shows exactly; the correctness checks (GEMM, memory
patterns) are real and untouched.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gpuwatchd.gpu.pcie_bandwidth import LinkExpectation
from gpuwatchd.probes.faults import ProbeFaults, faults_from_dict

log = logging.getLogger(__name__)

HEALTHY_LINK_SHARE = 0.9
# (probe, result key or dtype table, fault factor attribute)
_FIGURES = (
    ("pcie", "h2d_bytes_per_second", "bandwidth_factor"),
    ("pcie", "d2h_bytes_per_second", "bandwidth_factor"),
    ("memory", "d2d_bytes_per_second", "d2d_factor"),
    ("launch", "latency_seconds", None),
)


class SimProbes:
    def __init__(self, state_path: Path) -> None:
        self.state_path = state_path
        self._nominal: dict[tuple[str, str], float] = {}
        self._warned: set[str] = set()

    def faults(self, uuid: str) -> ProbeFaults:
        """The faults the scenario sets for this GPU now (none when the state or its ``_probe`` is absent)."""
        from gpuwatchd.sim.state import read_state

        try:
            state = read_state(self.state_path)
        except (OSError, ValueError):
            return ProbeFaults()
        for dev in state.get("devices") or []:
            if dev.get("uuid") == uuid:
                try:
                    return faults_from_dict(dev.get("_probe"))
                except ValueError as e:
                    if uuid not in self._warned:
                        self._warned.add(uuid)
                        log.warning("sim: ignoring probe faults of %s: %s", uuid, e)
        return ProbeFaults()

    def adjust(self, uuid: str, result: dict[str, Any], faults: ProbeFaults, link: LinkExpectation | None) -> None:
        """Map the CPU run's performance figures onto the simulated GPU, in place (see the module doc)."""
        probes = result.get("probes") or {}
        for probe, key, factor_name in _FIGURES:
            res = (probes.get(probe) or {}).get("result")
            if not res or not isinstance(res.get(key), int | float):
                continue
            factor = getattr(faults, factor_name) if factor_name else 1.0
            nominal = self._nominal.get((uuid, key))
            if nominal is None:
                if probe == "pcie" and link is not None:
                    nominal = link.bytes_per_second * HEALTHY_LINK_SHARE
                else:
                    nominal = float(res[key]) / factor
                self._nominal[(uuid, key)] = nominal
            res[key] = nominal * factor
        gemm = (probes.get("gemm") or {}).get("result") or {}
        for dtype, d in (gemm.get("dtypes") or {}).items():
            if isinstance(d.get("flops"), int | float):
                nominal = self._nominal.setdefault((uuid, f"flops_{dtype}"), float(d["flops"]) / faults.flops_factor)
                d["flops"] = nominal * faults.flops_factor
