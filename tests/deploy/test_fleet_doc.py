"""docs/fleet.md: every configuration it shows is an excerpt of a kit file the fleet test runs (marked with
``<!-- from PATH -->`` above the block), and the files and commands it names exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "fleet.md"
_BLOCK = re.compile(r"(?:<!-- from (?P<src>\S+) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)


def blocks() -> list[tuple[str | None, str, str]]:
    return [(m["src"], m["lang"], m["body"]) for m in _BLOCK.finditer(DOC.read_text())]


def test_every_config_block_is_an_excerpt_of_a_kit_file() -> None:
    found = blocks()
    configs = [b for b in found if b[1] == "yaml"]
    assert len(configs) >= 8
    for src, _, body in configs:
        assert src is not None, f"a yaml block without its source file:\n{body}"
        text = (ROOT / src).read_text()
        assert body in text, f"docs/fleet.md shows a block that is not in {src}:\n{body}"


def test_named_files_exist() -> None:
    doc = DOC.read_text()
    named = set(re.findall(r"`((?:deploy|dashboards|bench|tests)/[\w./-]+)`", doc))
    named |= {f"deploy/prometheus/{n}" for n in re.findall(r"`((?:prometheus|gpuwatchd-fleet)[\w.-]*\.yml)`", doc)}
    assert len(named) >= 10
    for path in named:
        assert (ROOT / path).exists(), path


def test_sizing_figures_come_from_the_bench_command() -> None:
    doc = DOC.read_text()
    assert "python bench/fleet.py" in doc
    for name in ("series_per_host_fleet", "scrape_gzip_kb_fleet", "churn_series_per_host_hour_fleet",
                 "prom_disk_gb_per_day", "vm_disk_gb_per_day"):
        assert name in doc and name in (ROOT / "bench" / "fleet.py").read_text(), name
