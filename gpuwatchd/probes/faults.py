"""Probe faults a simulation injects into a worker run: the sim side's only lever on the probes.

``gpuwatchd sim`` reads them per GPU from the stand-in state (``devices[N]._probe``, carried in the state file's
JSON copy and ignored by the C stand-in) and the runner hands them to the worker as ``--inject JSON``. Only a
:class:`~gpuwatchd.probes.service.ProbeService` built with a sim fault source passes ``--inject``; ``gpuwatchd
run`` never builds one, and the worker refuses ``--inject`` unless its device is ``cpu`` (a real GPU run can
never be faked), so an injected fault cannot reach a real probe (tests/probes/test_injection.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, Protocol

from gpuwatchd.gpu.pcie_bandwidth import LinkExpectation

Crash = Literal["exit", "segfault", "garbage", "truncated", "oom"]
CRASH_KINDS: tuple[str, ...] = ("exit", "segfault", "garbage", "truncated", "oom")


@dataclass(frozen=True, slots=True)
class ProbeFaults:
    """What to break in one worker run (all off by default)."""

    gemm_flip: int = 0  # GEMM output elements with a flipped exponent bit (in every run: a deterministic SDC)
    stuck_bits: int = 0  # memory words with bit 3 stuck at 1
    bandwidth_factor: float = 1.0  # multiplies the measured H2D/D2H bandwidth
    d2d_factor: float = 1.0  # multiplies the measured device-to-device bandwidth
    flops_factor: float = 1.0  # multiplies the measured FLOP/s
    hang: bool = False  # the worker never answers (the runner's deadline must kill it)
    crash: Crash | None = None  # exit 1 / SIGSEGV / a non-JSON line / a truncated JSON line / CUDA OOM
    nan: bool = False  # one GEMM output element becomes NaN
    cuda_error: str | None = None  # the GEMM probe raises this CUDA error string

    @property
    def active(self) -> bool:
        return self != ProbeFaults()

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v != getattr(ProbeFaults(), k)})


_NAMES = tuple(f.name for f in fields(ProbeFaults))


def faults_from_dict(data: Any) -> ProbeFaults:
    """Validate a ``_probe`` mapping; ValueError names the bad key."""
    if data is None:
        return ProbeFaults()
    if not isinstance(data, dict):
        raise ValueError(f"expected a mapping of probe faults, got {data!r}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _NAMES:
            raise ValueError(f"unknown probe fault {key!r} (known: {', '.join(_NAMES)})")
        if key in ("gemm_flip", "stuck_bits"):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000:
                raise ValueError(f"{key}: expected a count 0..1000000, got {value!r}")
        elif key.endswith("_factor"):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 10:
                raise ValueError(f"{key}: expected a factor in (0, 10], got {value!r}")
            out[key] = float(value)
            continue
        elif key in ("hang", "nan"):
            if not isinstance(value, bool):
                raise ValueError(f"{key}: expected true or false, got {value!r}")
        elif key == "crash":
            if value is not None and value not in CRASH_KINDS:
                raise ValueError(f"crash: expected one of {', '.join(CRASH_KINDS)}, got {value!r}")
        elif value is not None and (not isinstance(value, str) or not 0 < len(value) <= 200):
            raise ValueError(f"{key}: expected an error string (1-200 characters), got {value!r}")
        out[key] = value
    return ProbeFaults(**out)


def faults_from_json(text: str) -> ProbeFaults:
    return faults_from_dict(json.loads(text))


class ProbeSim(Protocol):
    """A simulation's fault source and CPU-run mapping (``sim/probes.py`` ``SimProbes``), as the service uses it."""

    def faults(self, uuid: str) -> ProbeFaults:
        """The faults the scenario sets for this GPU now."""

    def adjust(self, uuid: str, result: dict[str, Any], faults: ProbeFaults, link: LinkExpectation | None) -> None:
        """Map a CPU run's performance figures onto the simulated GPU, in place."""
