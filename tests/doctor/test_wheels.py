"""doctor/wheels.py: the torch wheel index chosen from the driver (issue 28 part 4): the newest torch with a CUDA
build whose major family's minimum driver this driver meets (minor version compatibility), else an upgrade."""

from __future__ import annotations

import pytest

from gpuwatchd.doctor.wheels import BUILDS, FAMILY_MIN_DRIVER, NEWEST_TORCH, choose, driver_tuple, no_build_why, runs_on


@pytest.mark.parametrize(("driver", "tag", "torch"), [
    ("418.39", None, None),  # CUDA 10.1: below every published build
    ("440.33.01", None, None),
    ("450.80.01", None, None),  # one below the CUDA 11 family's minimum
    ("450.80.02", "cu118", "2.7"),  # exactly the minimum
    ("470.256.02", "cu118", "2.7"),  # cuda-too-old's driver: CUDA 11.4, never cu124
    ("525.60.12", "cu118", "2.7"),  # one below the CUDA 12 family's minimum
    ("525.60.13", "cu126", NEWEST_TORCH),
    ("535.183.01", "cu126", NEWEST_TORCH),
    ("550.54.14", "cu126", NEWEST_TORCH),
    ("570.124.06", "cu126", NEWEST_TORCH),
    ("580.65.06", "cu132", NEWEST_TORCH),
    ("590.44.01", "cu132", NEWEST_TORCH),
    ("1000", "cu132", NEWEST_TORCH),
])
def test_index_from_driver(driver: str, tag: str | None, torch: str | None) -> None:
    c = choose(driver)
    if tag is None:
        assert c is None
        return
    assert c is not None and (c.build.tag, c.torch) == (tag, torch)
    assert driver_tuple(driver) >= FAMILY_MIN_DRIVER[c.build.cuda[0]]  # type: ignore[operator]
    line = c.pip("/opt/venv/bin/python")
    assert line.endswith(f"--index-url https://download.pytorch.org/whl/{tag}")
    assert ("'torch==" in line) == (torch != NEWEST_TORCH)  # pinned only where the newest torch has no such build


def test_every_build_the_chosen_torch_has_that_the_driver_runs_is_older_than_the_choice() -> None:
    for driver in ("450.80.02", "525.60.13", "560.35.03", "580.65.06"):
        c = choose(driver)
        assert c is not None
        runnable = [b for b in BUILDS if c.torch in b.torch and runs_on(f"{b.cuda[0]}.{b.cuda[1]}", driver)]
        assert max(b.cuda for b in runnable) == c.build.cuda


@pytest.mark.parametrize(("cuda", "driver", "runs"), [
    ("12.4", "470.256.02", False), ("12.8", "525.60.13", True), ("12.8", "525.60.12", False),
    ("11.8", "450.80.02", True), ("13.0", "575.57.08", False), ("13.0", "580.65.06", True),
    ("10.2", "550.54.14", None), ("12.4", "garbage", None),
])
def test_runs_on(cuda: str, driver: str, runs: bool | None) -> None:
    assert runs_on(cuda, driver) is runs


def test_driver_versions_parse_as_nvidia_writes_them() -> None:
    assert driver_tuple("470.256.02") == (470, 256, 2)
    assert driver_tuple("550.54") == (550, 54)
    assert driver_tuple("r550") is None and driver_tuple("") is None


@pytest.mark.parametrize(("driver", "gpus", "tag", "torch"), [
    ("580.65.06", [(6, 1)], "cu126", NEWEST_TORCH),  # Pascal: the 13.x builds start at Turing
    ("580.65.06", [(7, 5), (6, 0)], "cu126", NEWEST_TORCH),  # every GPU of the host must have kernels
    ("580.65.06", [(12, 0)], "cu132", NEWEST_TORCH),
    ("570.124.06", [(12, 0)], "cu128", "2.11"),  # Blackwell on a 12.x driver: cu126 has no kernels for it
    ("570.124.06", [(9, 0)], "cu126", NEWEST_TORCH),
    ("535.183.01", [(5, 2)], "cu126", NEWEST_TORCH),  # Maxwell
    ("470.256.02", [(7, 5)], "cu118", "2.7"),  # cuda-too-old's T4
    ("470.256.02", [(3, 7)], "cu118", "2.7"),
    ("470.256.02", [(3, 5)], None, None),  # Kepler GK110: no wheel has kernels for it
    ("525.60.12", [(12, 0)], None, None),
])
def test_index_from_driver_and_gpus(driver: str, gpus: list[tuple[int, int]], tag: str | None,
                                    torch: str | None) -> None:
    c = choose(driver, gpus)
    if tag is None:
        assert c is None
        why = no_build_why(driver, gpus)
        assert f"compute capability {gpus[0][0]}.{gpus[0][1]}" in why and "upgrade the NVIDIA driver first" not in why
        return
    assert c is not None and (c.build.tag, c.torch) == (tag, torch)
    assert "upgrade the NVIDIA driver first" in no_build_why("418.39", gpus)
