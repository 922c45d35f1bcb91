"""The NVML worker as the daemon starts it: ``python -S`` with the daemon's import path handed over explicitly.

The worker runs without ``site`` (docs/performance.md: ~5 MB of its RSS), so everything ``site`` would have put on
``sys.path`` -- site-packages, ``.pth`` lines, an editable install's finder hook -- must come from the daemon. These
tests spawn it with the argv and environment the supervisor builds, and pin what it loads, so a heavy import
creeping into the worker is a failing test rather than a figure nobody re-measures."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import site
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state
from gpuwatchd.sources.nvml.protocol import WORKER_MODULE
from gpuwatchd.sources.nvml.worker_process import child_env, import_path, worker_argv

REPO = Path(__file__).resolve().parents[3]
# What the worker must not load: each is ~0.5-5 MB in a process whose whole budget is ~15 MB. psutil it loads: the
# product's source of host process facts (processes.ProcResolver), ~1.7 MB with what it imports (socket, select:
# docs/performance.md). ``ctypes.util`` (with shutil, tempfile, bz2, lzma, random), which pynvml imports and never
# calls, and ``subprocess``, ``datetime`` (with locale), ``base64`` and ``glob``, which psutil imports for calls the
# worker does not make, are stand-ins until used (worker/stand_ins.py); ``typing`` only type checkers read
# (TYPE_CHECKING blocks).
NOT_IN_THE_WORKER = ("site", "dataclasses", "inspect", "pathlib", "asyncio", "ssl", "pydantic",
                     "yaml", "aiohttp", "prometheus_client", "gpuwatchd.model", "gpuwatchd.config",
                     "ctypes.util", "shutil", "tempfile", "bz2", "lzma", "random", "subprocess", "datetime", "locale",
                     "base64", "binascii", "glob", "fnmatch", "typing")


def _imported(stderr: str) -> set[str]:
    """Module names from ``-X importtime`` lines (``import time: self | cumulative | <indent>name``)."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_the_worker_runs_without_site_and_loads_only_what_it_needs(
    standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path]
) -> None:
    # The environment without PYTHONPATH: this package and pynvml must be found from what the daemon hands over.
    env = child_env({**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                     STATE_ENV: str(write_sim_state(make_state(2)))}, standin_libdir)
    argv = worker_argv(sys.executable, WORKER_MODULE)
    assert argv[1:] == ["-S", "-m", WORKER_MODULE]
    opts = {"interval": 0.0, "max_polls": 1, "library_path": str(standin_libdir / "libnvidia-ml.so.1")}
    r = subprocess.run([argv[0], "-X", "importtime", *argv[1:], json.dumps(opts)], env=env, capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert "hello" in lines[0] and lines[1]["nvml_ok"] and len(lines[1]["gpus"]) == 2
    loaded = _imported(r.stderr)
    assert {"pynvml", "psutil", "gpuwatchd.sources.nvml.worker.session"} <= loaded
    assert sorted(m for m in loaded if m in NOT_IN_THE_WORKER or m.split(".")[0] in NOT_IN_THE_WORKER) == []


class _EditableFinder(importlib.abc.MetaPathFinder):
    """Like setuptools' editable-install finder: maps one top-level package to a directory not on sys.path."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name, self.directory = name, directory

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        pkg = self.directory / fullname
        return importlib.util.spec_from_file_location(fullname, pkg / "__init__.py",
                                                      submodule_search_locations=[str(pkg)])


def test_pth_directories_and_finder_hooks_reach_the_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module on a ``.pth``-added directory and a package only an import hook knows (an editable install) are
    importable in a ``-S`` child given the daemon's :func:`child_env`; so is this very checkout of gpuwatchd."""
    site_dir, pth_dir, hooked = tmp_path / "site-packages", tmp_path / "pth-target", tmp_path / "src"
    for d in (site_dir, pth_dir, hooked / "hookpkg"):
        d.mkdir(parents=True)
    (pth_dir / "pthmod.py").write_text("WHERE = 'pth'\n")
    (hooked / "hookpkg" / "__init__.py").write_text("WHERE = 'hook'\n")
    (site_dir / "extra.pth").write_text(f"{pth_dir}\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, _EditableFinder("hookpkg", hooked)])
    site.addsitedir(str(site_dir))  # what site does at start-up for every site-packages
    modules = ("pynvml", "psutil", "pthmod", "hookpkg")
    assert str(hooked) in import_path(modules)  # the hook's directory, found without importing the package
    env = child_env({k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, None, modules=modules)
    code = ("import sys, pynvml, psutil, pthmod, hookpkg, gpuwatchd.sources.nvml.worker.main as w; "
            "print(pthmod.WHERE, hookpkg.WHERE, w.__file__, 'site' in sys.modules)")
    r = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    where_pth, where_hook, worker_file, site_loaded = r.stdout.split()
    assert (where_pth, where_hook, site_loaded) == ("pth", "hook", "False")
    assert Path(worker_file).resolve().is_relative_to(REPO)  # this checkout, not another install's copy
