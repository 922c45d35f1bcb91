"""The layers docs/architecture.md draws ("Imports run one way"): every import of a package under gpuwatchd/ goes to
a package drawn on a line below its own, read from the drawing itself; the exceptions are the ones the page names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpuwatchd"
# config/loader.py assembles the sections each part owns (docs/architecture.md says why)
ALLOWED = {("config", "notify"), ("config", "probes"), ("config", "rules"), ("config", "web"),
           ("config", "remediation")}


def _layers() -> dict[str, int]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("Imports run one way", 1)[1].split("\n\n", 2)[1]
    rank = {}
    for i, line in enumerate(block.splitlines()):
        for name in re.findall(r"([a-z_]+)(?:/|\.py)", re.split(r"\s{3,}", line.strip())[0]):
            rank[name] = i
    return rank


def test_the_drawing_names_every_package() -> None:
    rank = _layers()
    tops = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
            if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name not in
                                                                   ("__init__.py", "__main__.py"))}
    assert tops <= set(rank), tops - set(rank)


def test_imports_run_down_the_drawing() -> None:
    rank = _layers()
    up = set()
    for p in sorted(PACKAGE.rglob("*.py")):
        src = p.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if src not in rank:
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                parts = name.split(".")
                if len(parts) < 2 or parts[0] != "gpuwatchd":
                    continue
                dst = parts[1]
                if dst != src and dst in rank and rank[dst] <= rank[src] and (src, dst) not in ALLOWED:
                    up.add(f"{p.relative_to(ROOT)} imports {name} ({dst} is not below {src})")
    assert not up, "\n".join(sorted(up))
