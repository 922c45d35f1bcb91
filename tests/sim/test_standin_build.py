"""Building the stand-in: cache, parallel builds, and clear errors when the toolchain is missing."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import gpuwatchd
from gpuwatchd.sim.build import SONAME, StandinBuildError, build_standin, find_nvml_header


def test_header_is_nvidias() -> None:
    header = find_nvml_header()
    assert header.name == "nvml.h"
    assert "nvmlDeviceGetMemoryInfo_v2" in header.read_text()


def test_cached_build_is_reused(standin_libdir: Path) -> None:
    lib = standin_libdir / SONAME
    mtime = lib.stat().st_mtime_ns
    assert build_standin() == standin_libdir
    assert lib.stat().st_mtime_ns == mtime  # not rebuilt


@pytest.mark.timeout(120)
def test_parallel_builds_into_a_fresh_cache(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        dirs = list(pool.map(lambda _: build_standin(cache_dir=tmp_path), range(2)))
    assert dirs[0] == dirs[1]
    assert [p.name for p in tmp_path.iterdir()] == [dirs[0].name]  # no half-built leftovers
    ctypes.CDLL(str(dirs[0] / SONAME))  # loads


def test_omit_variants_are_cached_apart(standin_libdir: Path) -> None:
    variant = build_standin(omit=["nvmlDeviceGetTemperatureV"])
    assert variant != standin_libdir
    assert build_standin(omit=("nvmlDeviceGetTemperatureV",)) == variant


def test_unknown_omit_symbol(tmp_path: Path) -> None:
    with pytest.raises(StandinBuildError, match=r"cannot omit \['nvmlDeviceGetTemprature'\]"):
        build_standin(omit=["nvmlDeviceGetTemprature"], cache_dir=tmp_path)


def test_no_compiler(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(StandinBuildError, match=r"no C compiler found.*install gcc or set CC"):
        build_standin(cache_dir=tmp_path)


def test_compiler_error_carries_its_stderr(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", f"cc -include {tmp_path / 'missing.h'}")
    with pytest.raises(StandinBuildError, match=r"compiling the stand-in failed") as info:
        build_standin(cache_dir=tmp_path)
    assert "missing.h" in str(info.value) and "No such file" in str(info.value)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".build-")]  # the temp build dir is cleaned up


def test_missing_header_says_what_to_install(tmp_path: Path) -> None:
    # -S: no site-packages, so the nvidia-nvml-dev wheel is really absent for this interpreter.
    root = Path(gpuwatchd.__file__).parent.parent
    code = "from gpuwatchd.sim.build import find_nvml_header\nfind_nvml_header()"
    env = {**os.environ, "PYTHONPATH": str(root)}
    argv = [sys.executable, "-S", "-c", code]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode != 0
    assert "StandinBuildError: nvml.h not found" in res.stderr
    assert "pip install nvidia-nvml-dev==13.5.37" in res.stderr
