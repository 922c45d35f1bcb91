"""Generate gpuwatchd/gpu/xid_catalog.json, NVIDIA's Xid catalog as data.

    python tools/gen_xid_catalog.py Xid-Catalog.xlsx --via "https://docs.nvidia.com/Xid-Catalog.xlsx, <date>"
    python tools/gen_xid_catalog.py catalog_generated.go --via "leptonai/gpud <commit> <path>"

The catalog is NVIDIA's "Analyzing Xid Errors with the Xid Catalog" (SOURCE below), whose "Xids" sheet
(Xid-Catalog.xlsx, linked from that page) lists every code with its mnemonic, description and two resolution
buckets: the immediate action that recovers the system, and the investigatory one if it recurs. Input: NVIDIA's
spreadsheet itself (``.xlsx``: read with the standard library, the "Xids" sheet, columns found by their headers),
or leptonai/gpud's ``components/accelerator/nvidia/xid/catalog_generated.go``, a machine transcription of that sheet
(its header names the page and the time it was generated; only its ``catalogEntries`` table is read, as data).
The committed table was made from the latter. The output adds gpuwatchd's severity per code (``severity()``
below: the policy, in one place) and records where the table came from and as of when.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

SOURCE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
OUT = Path(__file__).resolve().parents[1] / "gpuwatchd" / "gpu" / "xid_catalog.json"

_ENTRY = re.compile(r"^\s*\{(Code: \d+,.*)\},\s*$")
_FIELD = re.compile(r'(\w+): ("(?:[^"\\]|\\.)*"|-?\d+)')
_GENERATED = re.compile(r"Generated at (\S+?)\.? Source: (\S+)")

# Buckets whose immediate action is a GPU reset or a reboot: the GPU is out of service until then.
CRITICAL_BUCKETS = frozenset({"RESET_GPU", "RESTART_BM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR",
                              "WORKFLOW_NVLINK5_ERR"})
# Codes gpuwatchd classes differently from their bucket, and why.
SEVERITY_OVERRIDES = {
    43: "warning",  # IGNORE for the GPU ("remains in a healthy state"), but the application hit a fault and died
    154: "info",  # XID_154: it restates the recovery action of another Xid; GpuRecoveryActionRequired carries it
}


def severity(code: int, immediate: str) -> str:
    """gpuwatchd's severity: critical when recovery needs a GPU reset or a reboot, info when NVIDIA says to ignore
    it, warning for the rest: an application restart, a check, and every bucket this table does not know yet
    (conservative: an alert, not a page)."""
    if code in SEVERITY_OVERRIDES:
        return SEVERITY_OVERRIDES[code]
    if immediate in CRITICAL_BUCKETS:
        return "critical"
    if immediate == "IGNORE":
        return "info"
    return "warning"


def _clean(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text).strip()


def parse_go_table(text: str) -> tuple[list[dict[str, object]], str | None]:
    """The ``catalogEntries`` rows of gpud's generated Go file, and the time it says it was generated."""
    m = _GENERATED.search(text)
    generated = m.group(1) if m else None
    start = text.index("var catalogEntries")
    end = text.index("\n}", start)
    rows: list[dict[str, object]] = []
    for line in text[start:end].splitlines():
        em = _ENTRY.match(line)
        if em is None:
            continue
        fields = {k: json.loads(v) for k, v in _FIELD.findall(em.group(1))}
        code = int(fields["Code"])
        immediate = _clean(str(fields.get("ImmediateResolution", "")))
        rows.append({
            "code": code,
            "mnemonic": _clean(str(fields.get("Mnemonic", ""))),
            "description": _clean(str(fields.get("Description", ""))),
            "immediate_action": immediate,
            "investigatory_action": _clean(str(fields.get("InvestigatoryResolution", ""))),
            "severity": severity(code, immediate),
        })
    return rows, generated


_NS = {"m": "http://schemas.openxmlformats.org/spreadsheetml/2006/main"}
_REL = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id"
HEADERS = {"code": "Code", "mnemonic": "Mnemonic", "description": "Description",
           "immediate_action": "Resolution Bucket (Immediate Action)",
           "investigatory_action": "Resolution Bucket (Investigatory Action)"}


def _col(ref: str) -> int:
    n = 0
    for ch in ref:
        if not ch.isalpha():
            break
        n = n * 26 + ord(ch.upper()) - 64
    return n - 1


def parse_xlsx(path: Path, sheet: str = "Xids") -> list[dict[str, object]]:
    """The catalog rows of NVIDIA's Xid-Catalog.xlsx (the named sheet, else the first)."""
    import zipfile

    # The developer's own download of NVIDIA's file, not input from the network at run time; CPython's expat
    # resolves no external entities and caps entity expansion (>= 2.4.1).
    from xml.etree import ElementTree as ET

    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        shared: list[str] = []
        if "xl/sharedStrings.xml" in names:
            for si in ET.fromstring(z.read("xl/sharedStrings.xml")).findall("m:si", _NS):  # noqa: S314
                shared.append("".join(t.text or "" for t in si.iter(f"{{{_NS['m']}}}t")))
        book = ET.fromstring(z.read("xl/workbook.xml"))  # noqa: S314
        sheets = book.findall("m:sheets/m:sheet", _NS)
        chosen = next((sh for sh in sheets if sh.get("name") == sheet), sheets[0])
        rels = ET.fromstring(z.read("xl/_rels/workbook.xml.rels"))  # noqa: S314
        target = next(r.get("Target", "") for r in rels if r.get("Id") == chosen.get(_REL))
        grid: list[list[str]] = []
        sheet_xml = ET.fromstring(z.read("xl/" + target.removeprefix("/xl/")))  # noqa: S314
        for row in sheet_xml.findall("m:sheetData/m:row", _NS):
            cells: dict[int, str] = {}
            for c in row.findall("m:c", _NS):
                kind, v = c.get("t"), c.find("m:v", _NS)
                if kind == "s" and v is not None:
                    text = shared[int(v.text or 0)]
                elif kind == "inlineStr":
                    text = "".join(t.text or "" for t in c.iter(f"{{{_NS['m']}}}t"))
                else:
                    text = v.text or "" if v is not None else ""
                cells[_col(c.get("r", "A"))] = text
            grid.append([cells.get(i, "") for i in range(max(cells, default=-1) + 1)])
    head_at = next(i for i, r in enumerate(grid) if HEADERS["code"] in [x.strip() for x in r])
    head = [x.strip() for x in grid[head_at]]
    cols = {k: head.index(h) for k, h in HEADERS.items()}
    rows: list[dict[str, object]] = []
    for r in grid[head_at + 1:]:
        cell = {k: _clean(r[i]) if i < len(r) else "" for k, i in cols.items()}
        if not cell["code"].replace(".0", "").isdigit():
            continue
        code = int(float(cell["code"]))
        rows.append({"code": code, "mnemonic": cell["mnemonic"], "description": cell["description"],
                     "immediate_action": cell["immediate_action"], "investigatory_action": cell["investigatory_action"],
                     "severity": severity(code, cell["immediate_action"])})
    return rows


def render(rows: list[dict[str, object]], meta: dict[str, object]) -> str:
    """One entry per line: the diff of a catalog update reads code by code."""
    head = json.dumps(meta, indent=1, ensure_ascii=False)[:-2]
    body = ",\n".join("  " + json.dumps(r, ensure_ascii=False) for r in rows)
    return f'{head},\n "entries": [\n{body}\n ]\n}}\n'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table", type=Path, help="NVIDIA's Xid-Catalog.xlsx, or leptonai/gpud's catalog_generated.go")
    ap.add_argument("--via", required=True, help="where the table was taken from (repository, commit, path)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--version", default="unknown", help="for an .xlsx: as of when it was downloaded")
    args = ap.parse_args()
    if args.table.suffix == ".xlsx":
        rows, generated = parse_xlsx(args.table), None
    else:
        rows, generated = parse_go_table(args.table.read_text(encoding="utf-8"))
    codes = [int(str(r["code"])) for r in rows]
    if len(set(codes)) != len(codes) or codes != sorted(codes):
        raise SystemExit("the table's codes are not unique and ascending")
    meta = {
        "source": SOURCE,
        "version": f"Xids sheet as transcribed {generated}" if generated else args.version,
        "via": args.via,
        "generator": "tools/gen_xid_catalog.py",
        "severity_policy": "critical: immediate action RESET_GPU, RESTART_BM, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, "
                           "WORKFLOW_NVLINK5_ERR; info: IGNORE; warning: the rest; overrides 43 warning, 154 info",
    }
    args.out.write_text(render(rows, meta), encoding="utf-8")
    print(f"{len(rows)} codes ({codes[0]}-{codes[-1]}) -> {args.out}")


if __name__ == "__main__":
    main()
