"""devices[N].gpm in the stand-in's state (sim/gpm_state.py): its metric table against standin_gpm.c and pynvml, and
the writer's validation."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from gpuwatchd.sim.build import SOURCE
from gpuwatchd.sim.gpm_state import GPM_METRICS
from gpuwatchd.sim.state import make_device, make_state, write_state

if TYPE_CHECKING:
    from pathlib import Path


def test_metric_table_matches_the_c_source_and_pynvml() -> None:
    import pynvml

    c = SOURCE.with_name("standin_gpm.c").read_text()
    assert re.findall(r"\{NVML_GPM_METRIC_(\w+), \"(\w+)\"", c) == [
        (k.upper(), k) for k, _ in GPM_METRICS
    ]
    for key, mid in GPM_METRICS:
        assert getattr(pynvml, f"NVML_GPM_METRIC_{key.upper()}") == mid


def test_state_validation(tmp_path: Path) -> None:
    for gpm, where in (({"sm_util": 101}, r"gpm\.sm_util"), ({"bogus": 1}, r"gpm\.bogus"),
                       ({"metric_errors": {"sm_util": "NOPE"}}, r"metric_errors\.sm_util"),
                       ({"instances": {"x": {}}}, r"instances\.x")):
        with pytest.raises(ValueError, match=where):
            write_state(tmp_path / "s", make_state(0, devices=[make_device(0, gpm=gpm)]))
