"""doctor against simulated hosts: each scenario's expected check fails (or warns) with its fix, and every other
check passes. The stand-in driver, the fake /proc, /sys (PCI and Thunderbolt) and /dev trees are what
``gpuwatchd sim`` keeps; NVML runs in doctor's own child process, as on a real host."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpuwatchd.sim
from gpuwatchd.doctor.report import Result, exit_code
from gpuwatchd.doctor.run import run_checks

from .conftest import SimHost

# scenario, time -> the checks that do not pass: (group, check, status, words of the detail, words of the fix).
# Every other check (the daemon group aside: no daemon runs here) passes.
EXPECTED: dict[tuple[str, float], set[tuple[str, str, str]]] = {
    ("idle", 10.0): set(),
    ("driver-mismatch", 5.0): {
        ("driver", "libnvidia-ml.so.1", "fail"),
        ("cuda", "torch.cuda", "fail"),  # what the mismatch does to torch
    },
    ("cuda-too-old", 5.0): {("cuda", "torch build", "fail")},
    ("dock-unauthorized", 10.0): {("thunderbolt", "dock Razer Core X", "fail")},
    ("tb-link-degraded", 60.0): {("gpu 0", "Thunderbolt", "warn")},
    ("link-degraded", 60.0): {("gpu 0", "PCIe link", "warn")},
    ("power-brake", 100.0): {("gpu 0", "clock events", "warn")},
    ("ecc", 200.0): {("gpu 0", "memory", "warn")},
}
WORDS: dict[tuple[str, str], tuple[str, str]] = {
    ("driver", "libnvidia-ml.so.1"): ("Driver/library version mismatch", "reboot"),
    ("cuda", "torch build"): (
        "built for CUDA 12.4, but the driver supports only up to 11.4", "upgrade the NVIDIA driver"
    ),
    ("thunderbolt", "dock Razer Core X"): ("not authorized", "boltctl enroll c6030000-0062-0c0e-8328-a0e1c2a5f30b"),
    ("gpu 0", "Thunderbolt"): ("1 x 10 Gb/s", "certified 40 Gb/s"),
    ("gpu 0", "PCIe link"): ("gen1 x4 of gen4 x16 while 96% busy", "reseat"),
    ("gpu 0", "clock events"): ("hw_power_brake", "PSU"),
    ("gpu 0", "memory"): ("row remap pending", "nvidia-smi -r"),
}


def _not_passing(results: list[Result]) -> set[tuple[str, str, str]]:
    return {(r.group, r.check, r.status) for r in results if r.status != "pass" and r.group != "daemon"}


@pytest.mark.parametrize(("name", "t"), sorted(EXPECTED))
def test_scenario(name: str, t: float, sim_host: SimHost) -> None:
    results = run_checks(sim_host(name, t))
    assert _not_passing(results) == EXPECTED[(name, t)], "\n".join(map(str, results))
    for r in results:
        if (r.group, r.check) in WORDS and r.status != "pass":
            detail, fix = WORDS[(r.group, r.check)]
            assert detail in r.detail and fix in r.fix, r
    daemon = {(r.check, r.status) for r in results if r.group == "daemon"}
    assert daemon == {("config", "pass"), ("state dir", "pass"), ("running", "warn")}
    assert exit_code([r for r in results if r.group != "daemon"]) == max(
        (2 if s == "fail" else 1 for *_, s in EXPECTED[(name, t)]), default=0
    )


def test_idle_host_lists_what_it_checked(sim_host: SimHost) -> None:
    checks = {(r.group, r.check) for r in run_checks(sim_host("idle", 10.0))}
    for gpu in ("gpu 0", "gpu 1"):
        for check in ("PCIe link", "Thunderbolt", "memory", "power limit", "clock events"):
            assert (gpu, check) in checks
    for check in [("driver", "kernel module"), ("driver", "nouveau"), ("driver", "libnvidia-ml.so.1"),
                  ("devices", "device nodes"), ("devices", "device access"), ("devices", "persistence mode"),
                  ("cuda", "driver CUDA"), ("cuda", "torch build"), ("cuda", "torch.cuda"), ("cuda", "torch devices")]:
        assert check in checks


def test_nvml_hang_returns_within_its_deadline(sim_host: SimHost) -> None:
    # From 5 s on every call on GPU 1 blocks for a minute: the probe is killed at the deadline, GPU 0's facts stay.
    host = sim_host("nvml-hang", 10.0, deadline=3.0)
    t0 = time.monotonic()
    results = run_checks(host)
    assert time.monotonic() - t0 < 60  # the hang lasts 60 s; a liveness bound, not a timing assertion
    lib = next(r for r in results if r.check == "libnvidia-ml.so.1")
    assert lib.status == "fail" and "GPU 1 stopped answering" in lib.detail
    assert "gpu 0" in {r.group for r in results} and "gpu 1" not in {r.group for r in results}


# Issue 28 part 4: the torch advice follows the driver, on the stand-in driver with versions no scenario ships.
# driver -> (its CUDA as NVML says it, the index doctor must name or None for "upgrade first", whether the installed
# torch 2.5.1+cu124 runs: minor version compatibility, CUDA 12.x builds on >= 525.60.13)
DRIVERS: dict[str, tuple[int, str | None, bool]] = {
    "418.39": (10010, None, False),
    "450.80.02": (11000, "cu118", False),
    "470.256.02": (11040, "cu118", False),
    "525.60.12": (12000, "cu118", False),
    "525.60.13": (12000, "cu126", True),
    "535.183.01": (12020, "cu126", True),
    "550.54.14": (12040, "cu126", True),
    "570.124.06": (12080, "cu126", True),
    "580.65.06": (13000, "cu132", True),
}


def _driver_scenario(tmp: Path, driver: str, cuda: int, torch: dict[str, Any],
                     cc: tuple[int, int] | None = None) -> Path:
    base = yaml.safe_load((Path(gpuwatchd.sim.__file__).parent / "scenarios" / "cuda-too-old.yml").read_text())
    base["name"] = "driver-" + driver.replace(".", "-")
    base["system"].update({"driver_version": driver, "nvml_version": f"{cuda // 1000}.{driver}",
                           "cuda_driver_version": cuda, "torch": torch})
    if cc is not None:
        base["devices"][0]["cuda_compute_capability"] = list(cc)
    path = tmp / f"driver-{driver}.yml"
    path.write_text(yaml.safe_dump(base))
    return path


@pytest.mark.parametrize("driver", sorted(DRIVERS))
def test_torch_advice_follows_the_driver(driver: str, sim_host: SimHost, tmp_path: Path) -> None:
    cuda, tag, runs = DRIVERS[driver]
    missing = _driver_scenario(tmp_path, driver, cuda, {"installed": False})
    (r,) = [r for r in run_checks(sim_host(str(missing), 5.0)) if (r.group, r.check) == ("cuda", "torch")]
    assert r.status == "warn"
    if tag is None:
        assert "upgrade the NVIDIA driver first: >= 525.60.13" in r.fix and "index-url" not in r.fix.split(":")[0], r
    else:
        assert f"--index-url https://download.pytorch.org/whl/{tag}`" in r.fix, r
        assert "cu124" not in r.fix
    cu124 = _driver_scenario(tmp_path, driver, cuda, {"installed": True, "version": "2.5.1+cu124", "cuda": "12.4",
                                                      "available": runs, "device_count": int(runs)})
    (b,) = [r for r in run_checks(sim_host(str(cu124), 5.0)) if (r.group, r.check) == ("cuda", "torch build")]
    assert (b.status == "pass") is runs, b
    if not runs:
        assert "upgrade the NVIDIA driver to >= 525.60.13" in b.fix, b
        assert (f"whl/{tag}`" in b.fix) if tag is not None else "runs no published CUDA build" in b.fix, b
    elif cuda < 12040:
        assert "minor version compatibility" in b.detail, b


# The GPU's compute capability (nvmlDeviceGetCudaComputeCapability on the stand-in) narrows the builds to those with
# kernels for it: a Pascal card on a 580 driver gets cu126 (the 13.x builds start at Turing), a Blackwell card on a
# 570 driver cu128 with torch 2.11 (cu126 has no kernels for it), a Kepler card none.
ARCHS: dict[tuple[str, tuple[int, int]], str] = {
    ("580.65.06", (6, 1)): "whl/cu126`",
    ("580.65.06", (8, 9)): "whl/cu132`",
    ("570.124.06", (12, 0)): "'torch==2.11.*' --index-url https://download.pytorch.org/whl/cu128`",
    ("470.256.02", (3, 5)): "no published torch build has kernels for compute capability 3.5",
}


@pytest.mark.parametrize(("driver", "cc"), sorted(ARCHS))
def test_torch_advice_follows_the_gpus_architecture(driver: str, cc: tuple[int, int], sim_host: SimHost,
                                                   tmp_path: Path) -> None:
    cuda = {"580.65.06": 13000, "570.124.06": 12080, "470.256.02": 11040}[driver]
    path = _driver_scenario(tmp_path, driver, cuda, {"installed": False}, cc)
    (r,) = [r for r in run_checks(sim_host(str(path), 5.0)) if (r.group, r.check) == ("cuda", "torch")]
    assert r.status == "warn" and ARCHS[(driver, cc)] in r.fix, r
