"""The report: statuses, the fix under every warn/fail, exit codes 0/1/2, JSON."""

from __future__ import annotations

import json

import pytest

from gpuwatchd.doctor.report import Result, exit_code, fail, ok, render_json, render_text, warn


def test_exit_code_is_the_worst_status() -> None:
    assert exit_code([]) == 0
    assert exit_code([ok("g", "a", "x")]) == 0
    assert exit_code([ok("g", "a", "x"), warn("g", "b", "y", "do z")]) == 1
    assert exit_code([warn("g", "b", "y", "do z"), fail("g", "c", "w", "do v")]) == 2


def test_every_warn_and_fail_carries_its_fix() -> None:
    with pytest.raises(ValueError, match="needs a fix"):
        Result("g", "c", "fail", "broken")
    text = render_text([ok("driver", "nouveau", "not loaded"), fail("driver", "kernel module", "absent", "modprobe")])
    assert text.splitlines() == [
        "[PASS] driver: nouveau: not loaded",
        "[FAIL] driver: kernel module: absent",
        "       fix: modprobe",
        "1 passed, 0 warnings, 1 failed",
    ]


def test_json_has_every_check_and_the_exit_code() -> None:
    doc = json.loads(render_json([warn("cuda", "torch build", "cpu", "install cu124")]))
    assert doc == {"exit_code": 1, "checks": [
        {"group": "cuda", "check": "torch build", "status": "warn", "detail": "cpu", "fix": "install cu124"}]}
