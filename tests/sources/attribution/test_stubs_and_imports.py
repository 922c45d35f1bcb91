"""The committed pod-resources stubs are exactly what their generate.sh makes, and a host without the kubelet
socket never imports grpc (several MB)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PKG = "gpuwatchd/sources/attribution/podresources"
STUBS = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def test_committed_stubs_match_the_generator(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    (tmp_path / PKG).mkdir(parents=True)
    shutil.copy(ROOT / PKG / "api.proto", tmp_path / PKG / "api.proto")
    r = subprocess.run(["sh", str(ROOT / PKG / "generate.sh")], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    for name in STUBS:
        assert (tmp_path / PKG / name).read_text() == (ROOT / PKG / name).read_text(), (
            f"{PKG}/{name} differs from what generate.sh makes (grpcio-tools version pinned in pyproject.toml)")


def test_no_grpc_import_without_a_socket(tmp_path: Path) -> None:
    code = f"""
import asyncio, sys
from gpuwatchd.config.attribution import AttributionConfig
import gpuwatchd.daemon
from gpuwatchd.config.types import validate
from gpuwatchd.sources.attribution.task import AttributionTask
cfg = validate(AttributionConfig, {{"kubernetes": {{"pod_resources_socket": "{tmp_path}/absent.sock"}}}})
t = AttributionTask(cfg, socket_explicit=True)
asyncio.run(t.refresh())
assert t.errors["kubernetes"] == 1
assert "grpc" not in sys.modules and "google.protobuf" not in sys.modules, "grpc imported without a socket"
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
