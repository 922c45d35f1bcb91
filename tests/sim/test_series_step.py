"""The scenario ``series`` step: inline values and files of plain byte counts or sizes, one per ``every``."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuwatchd.sim.series_step import SeriesSpec, series_value

MIB = 1024**2


def test_inline_values_take_numbers_and_sizes_one_per_every_seconds() -> None:
    spec = SeriesSpec.model_validate({"path": "devices[0].memory.used", "every": 5, "values": [1024, "2MiB", 3.5]})
    assert spec.values == (1024.0, 2.0 * MIB, 3.5)
    assert spec.span == 15
    assert [series_value(spec, dt) for dt in (-1, 0, 4.9, 5, 12, 100)] == [1024, 1024, 1024, 2 * MIB, 3.5, 3.5]


def test_a_file_of_plain_byte_counts_sizes_and_comments(tmp_path: Path) -> None:
    f = tmp_path / "trace.txt"
    f.write_text("# used memory, bytes\n0\n1048576\n\n  2GiB  # after the model loads\n28209009\n")
    spec = SeriesSpec.model_validate({"path": "p", "file": str(f)})
    assert spec.values == (0.0, float(MIB), 2.0 * 1024**3, 28209009.0)


@pytest.mark.parametrize("bad", ["lots", "nan", "inf"])
def test_a_value_that_is_no_finite_number_is_refused_with_its_position(tmp_path: Path, bad: str) -> None:
    f = tmp_path / "trace.txt"
    f.write_text(f"1\n{bad}\n")
    with pytest.raises(ValidationError, match=r"values\[1\]"):
        SeriesSpec.model_validate({"path": "p", "file": str(f)})
