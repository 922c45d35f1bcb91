"""Generate gpuwatchd/gpu/xid_catalog.json, NVIDIA's Xid catalog as data.

    python tools/gen_xid_catalog.py catalog_generated.go --via "leptonai/gpud <commit> <path>"

The catalog is NVIDIA's "Analyzing Xid Errors with the Xid Catalog" (SOURCE below), whose "Xids" sheet
(Xid-Catalog.xlsx, linked from that page) lists every code with its mnemonic, description and two resolution
buckets: the immediate action that recovers the system, and the investigatory one if it recurs. The input read
here is leptonai/gpud's ``components/accelerator/nvidia/xid/catalog_generated.go``, a verbatim machine transcription
of that sheet (its header names the page and the time it was generated); only its ``catalogEntries`` table is read,
as data. The output adds gpuwatchd's severity per code (``severity()`` below: the policy, in one place) and records
where the table came from and as of when.
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


def render(rows: list[dict[str, object]], meta: dict[str, object]) -> str:
    """One entry per line: the diff of a catalog update reads code by code."""
    head = json.dumps(meta, indent=1, ensure_ascii=False)[:-2]
    body = ",\n".join("  " + json.dumps(r, ensure_ascii=False) for r in rows)
    return f'{head},\n "entries": [\n{body}\n ]\n}}\n'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table", type=Path, help="leptonai/gpud's components/accelerator/nvidia/xid/catalog_generated.go")
    ap.add_argument("--via", required=True, help="where the table was taken from (repository, commit, path)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rows, generated = parse_go_table(args.table.read_text(encoding="utf-8"))
    codes = [int(str(r["code"])) for r in rows]
    if len(set(codes)) != len(codes) or codes != sorted(codes):
        raise SystemExit("the table's codes are not unique and ascending")
    meta = {
        "source": SOURCE,
        "version": f"Xids sheet as transcribed {generated}" if generated else "unknown",
        "via": args.via,
        "generator": "tools/gen_xid_catalog.py",
        "severity_policy": "critical: immediate action RESET_GPU, RESTART_BM, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, "
                           "WORKFLOW_NVLINK5_ERR; info: IGNORE; warning: the rest; overrides 43 warning, 154 info",
    }
    args.out.write_text(render(rows, meta), encoding="utf-8")
    print(f"{len(rows)} codes ({codes[0]}-{codes[-1]}) -> {args.out}")


if __name__ == "__main__":
    main()
