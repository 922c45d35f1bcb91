"""Which PyTorch wheel index fits this driver: the ``pip install torch --index-url .../cuXYZ`` doctor suggests.

A CUDA build of torch brings its own CUDA runtime; what it needs from the host is a driver new enough for that
runtime's *major* version. Since CUDA 11, a build of any minor version runs on every driver of its major family's
minimum ("minor version compatibility", with a limited feature set: no JIT of PTX newer than the driver). So the
choice is: the newest torch, and of its CUDA builds the newest whose family minimum this driver meets; when the
newest torch has none, the newest older torch that has one; when no published build fits, upgrade the driver.

Sources (docs/egpu.md, "Which torch build fits the driver", has the table and the links):
- family minima (Linux x86_64): NVIDIA, "CUDA Compatibility", Minor Version Compatibility, Table 1, and the CUDA
  Toolkit release notes' Table 3: CUDA 11.x >= 450.80.02, 12.x >= 525.60.13, 13.x >= 580 (580.65.06, the 13.0 GA
  driver);
- which torch releases have which index: pytorch/pytorch RELEASE.md, "Release Compatibility Matrix" (stable and
  experimental CUDA per release; each has its download.pytorch.org/whl/cuXYZ index).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

INDEX_URL = "https://download.pytorch.org/whl/"

# CUDA major -> the oldest Linux driver that runs any build of that major (minor version compatibility).
FAMILY_MIN_DRIVER: dict[int, tuple[int, ...]] = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}


@dataclass(frozen=True, slots=True)
class Build:
    """One wheel index: its tag, its CUDA version, the torch minor releases published on it, and the GPU
    architectures (CUDA compute capabilities) its kernels are built for."""

    tag: str  # cu126
    cuda: tuple[int, int]  # (12, 6)
    torch: tuple[str, ...]  # "2.6", "2.7", ... oldest first
    arch: tuple[tuple[int, int], tuple[int, int]]  # oldest and newest compute capability with kernels

    @property
    def min_driver(self) -> tuple[int, ...]:
        return FAMILY_MIN_DRIVER[self.cuda[0]]

    @property
    def url(self) -> str:
        return INDEX_URL + self.tag


# pytorch/pytorch RELEASE.md, Release Compatibility Matrix (stable and experimental CUDA of each release, 2.0-2.14);
# architectures: RELEASE.md "PyTorch CUDA Support Matrix" (12.6: Maxwell 5.0 to Hopper 9.0; 13.x: Turing 7.5 to
# Blackwell 12.0 + PTX) and the sm_ lists of the published 2.5-2.7 builds (cu118 from sm_37; cu128 sm_75-sm_120).
# The cu128/cu129 range is the 2.7 build's, the narrowest; a newer GPU than a build's newest runs none of its
# kernels (a 13.x build's PTX for 12.0 is JIT-compiled for newer ones).
_HOPPER, _BLACKWELL, _NEWER = (9, 0), (12, 0), (12, 99)
BUILDS: tuple[Build, ...] = (
    Build("cu118", (11, 8), ("2.0", "2.1", "2.2", "2.3", "2.4", "2.5", "2.6", "2.7"), ((3, 7), _HOPPER)),
    Build("cu121", (12, 1), ("2.1", "2.2", "2.3", "2.4", "2.5"), ((5, 0), _HOPPER)),
    Build("cu124", (12, 4), ("2.4", "2.5", "2.6"), ((5, 0), _HOPPER)),
    Build("cu126", (12, 6), ("2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13", "2.14"), ((5, 0), _HOPPER)),
    Build("cu128", (12, 8), ("2.7", "2.8", "2.9", "2.10", "2.11"), ((7, 5), _BLACKWELL)),
    Build("cu129", (12, 9), ("2.8",), ((7, 5), _BLACKWELL)),
    Build("cu130", (13, 0), ("2.9", "2.10", "2.11", "2.12", "2.13", "2.14"), ((7, 5), _NEWER)),
    Build("cu132", (13, 2), ("2.12", "2.13", "2.14"), ((7, 5), _NEWER)),
)


def _release(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


NEWEST_TORCH = max((t for b in BUILDS for t in b.torch), key=_release)


def driver_tuple(version: str) -> tuple[int, ...] | None:
    """``"470.256.02"`` -> (470, 256, 2); None for anything that is not a dotted driver version."""
    m = re.fullmatch(r"\s*(\d{1,4})(?:\.(\d{1,4}))?(?:\.(\d{1,4}))?\s*", version)
    if m is None:
        return None
    return tuple(int(x) for x in m.groups() if x is not None)


def _meets(driver: tuple[int, ...], minimum: tuple[int, ...]) -> bool:
    width = max(len(driver), len(minimum))
    return driver + (0,) * (width - len(driver)) >= minimum + (0,) * (width - len(minimum))


@dataclass(frozen=True, slots=True)
class Choice:
    """The wheel index to install from, and the newest torch release it has."""

    build: Build
    torch: str  # "2.14"

    @property
    def latest(self) -> bool:
        """The newest torch release there is (then no version pin is needed)."""
        return self.torch == NEWEST_TORCH

    def pip(self, python: str) -> str:
        """``python -m pip install torch --index-url .../cu126`` (pinned to the release when it is not the newest)."""
        what = "torch" if self.latest else f"'torch=={self.torch}.*'"
        return f"{python} -m pip install {what} --index-url {self.build.url}"


def _has_kernels(b: Build, gpus: Sequence[tuple[int, int]]) -> bool:
    return all(b.arch[0] <= cc <= b.arch[1] for cc in gpus)


def choose(driver_version: str, gpus: Sequence[tuple[int, int]] = ()) -> Choice | None:
    """The newest torch with a CUDA build this driver runs and that has kernels for every GPU's compute capability
    in ``gpus`` (none given: any), on that torch's newest such build; None when no published build fits (see
    :func:`no_build_why`) or the version does not parse."""
    driver = driver_tuple(driver_version)
    if driver is None:
        return None
    fits = [b for b in BUILDS if _meets(driver, b.min_driver) and _has_kernels(b, gpus)]
    if not fits:
        return None
    torch = max((t for b in fits for t in b.torch), key=_release)
    build = max((b for b in fits if torch in b.torch), key=lambda b: b.cuda)
    return Choice(build, torch)


def no_build_why(driver_version: str, gpus: Sequence[tuple[int, int]] = ()) -> str:
    """Why :func:`choose` found nothing: the driver is too old, or no build has kernels for these GPUs."""
    driver = driver_tuple(driver_version)
    if driver is not None and any(_meets(driver, b.min_driver) for b in BUILDS):
        ccs = ", ".join(f"{a}.{b}" for a, b in sorted(set(gpus)))
        return (f"no published torch build has kernels for compute capability {ccs} that driver {driver_version} "
                "runs: build torch from source for it, or (a new GPU) upgrade the driver and take the newest index")
    return f"driver {driver_version} runs no published CUDA build of torch: {upgrade_advice()}"


def runs_on(cuda: str, driver_version: str) -> bool | None:
    """Whether a build for CUDA ``cuda`` ("12.4") runs on this driver (its major family's minimum); None when
    either does not parse or the major is not one this table knows."""
    driver = driver_tuple(driver_version)
    m = re.match(r"\s*(\d+)\.", cuda)
    if driver is None or m is None or int(m.group(1)) not in FAMILY_MIN_DRIVER:
        return None
    return _meets(driver, FAMILY_MIN_DRIVER[int(m.group(1))])


def text(v: tuple[int, ...]) -> str:
    """(525, 60, 13) -> ``525.60.13`` (minor parts two digits, as NVIDIA writes them)."""
    return ".".join([str(v[0]), *(f"{x:02d}" for x in v[1:])])


def upgrade_advice() -> str:
    """What to do when no published build runs on the driver."""
    newest = max(BUILDS, key=lambda b: b.cuda)
    twelve = max((b for b in BUILDS if b.cuda[0] == 12 and NEWEST_TORCH in b.torch), key=lambda b: b.cuda)
    return (f"upgrade the NVIDIA driver first: >= {text(FAMILY_MIN_DRIVER[12])} runs the {twelve.tag} builds, "
            f">= {text(FAMILY_MIN_DRIVER[newest.cuda[0]])} the {newest.tag} ones (the distribution's driver "
            "package, or NVIDIA's); then install torch from that index")
