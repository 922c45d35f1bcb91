"""``gpuwatchd doctor --python PATH`` where PATH prints what no Python would: JSON nested 100k deep, JSON of the wrong
shape, 4 MB lines. The child's output is read within bounds (runtime/json_answer.py): the doctor reports the
interpreter as unusable, never a traceback (issue 34: RecursionError)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

OUTPUTS = {
    "deep": "printf '%.0s[' $(seq 100000); printf '%.0s]' $(seq 100000); echo",
    "deep-check": "printf '{\"check\": '; printf '%.0s[' $(seq 50000); printf '%.0s]' $(seq 50000); echo '}'",
    "shapes": "echo '5'; echo '[1, 2]'; echo '{\"check\": 7}'; echo '{\"init\": [], \"gpu\": 3}'",
    "huge-line": "head -c 4000000 /dev/zero | tr '\\0' '{'; echo",
}


@pytest.mark.parametrize("kind", list(OUTPUTS))
def test_an_interpreter_printing_hostile_json_is_a_failed_check_not_a_traceback(tmp_path: Path, kind: str) -> None:
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\n{OUTPUTS[kind]}\nexit 0\n")
    fake.chmod(0o755)
    res = subprocess.run([sys.executable, "-m", "gpuwatchd", "doctor", "--python", str(fake), "--deadline", "60",
                          "--url", "http://127.0.0.1:9"],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=300, check=False)
    assert "Traceback" not in res.stdout + res.stderr, res.stderr[-3000:]
    assert res.returncode in (1, 2), (res.returncode, res.stdout[-2000:], res.stderr[-2000:])
    assert "torch" in res.stdout
