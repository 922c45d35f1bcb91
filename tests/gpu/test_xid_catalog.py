"""NVIDIA's Xid catalog as data: the committed table parses, says where it came from, covers the whole catalog,
and is what tools/gen_xid_catalog.py makes of its input."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

from gpuwatchd.gpu import xid_catalog
from gpuwatchd.gpu.health import health_actions, xid_action
from gpuwatchd.rules import xid as xid_rule

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "gpuwatchd" / "gpu" / "xid_catalog.json"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_xid_catalog", ROOT / "tools" / "gen_xid_catalog.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_table_parses_and_says_its_source_and_version() -> None:
    doc = json.loads(TABLE.read_text())
    assert doc["source"] == "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
    assert doc["version"] and doc["via"] and doc["generator"] == "tools/gen_xid_catalog.py"
    cat = xid_catalog.catalog()
    codes = sorted(cat.entries)
    assert len(codes) >= 170 and codes == list(range(1, codes[-1] + 1))  # the whole catalog, no gaps
    for e in cat.entries.values():
        assert e.mnemonic and e.description and e.severity in ("info", "warning", "critical")
        assert set(doc["entries"][e.code - 1]) == {"code", "mnemonic", "description", "immediate_action",
                                                    "investigatory_action", "severity"}


def test_known_codes_carry_nvidias_buckets_and_their_severity() -> None:
    e79 = xid_catalog.entry(79)
    assert e79 is not None and "FALLEN_OFF_THE_BUS" in e79.mnemonic
    assert (e79.immediate_action, e79.severity) == ("RESTART_BM", "critical")
    e13 = xid_catalog.entry(13)
    assert e13 is not None and (e13.immediate_action, e13.investigatory_action, e13.severity) == (
        "RESTART_APP", "WORKFLOW_XID_13", "warning")
    assert xid_rule.severity(63) == "info" and xid_rule.severity(43) == "warning"  # 43: the app died
    assert xid_rule.severity(46) == "critical"  # RESET_GPU, beyond the codes gpuwatchd words itself
    assert xid_rule.severity(9999) == "warning"  # not in the catalog: conservative, an alert and not a page
    assert xid_catalog.entry(9999) is None


def test_messages_use_the_catalog_beyond_the_worded_codes() -> None:
    meaning, action = xid_rule.describe(46)
    assert meaning == "GPU_TIMEOUT_ERROR: GPU stopped processing"
    assert action.startswith("Reset the GPU") and "If it recurs: contact your hardware vendor" in action
    assert "marks unused" in xid_rule.describe(1)[0]
    assert xid_rule.describe(9999)[0] == "an Xid this daemon has no catalog entry for"


def test_every_bucket_maps_to_a_health_action() -> None:
    actions = health_actions()
    assert set(actions) == set(xid_catalog.catalog().entries)
    assert (actions[79], actions[48], actions[13], actions[43], actions[54]) == (
        "reboot", "reset_gpu", "restart_app", "restart_app", "inspect_hardware")
    assert xid_action("RESTART_BM") == "reboot"


def test_the_generator_reads_gpuds_go_table_and_writes_this_format(tmp_path: Path) -> None:
    gen = _generator()
    go = ('// Generated at 2025-10-29T00:35:32Z. Source: https://docs.nvidia.com/x.html\n'
          'var catalogEntries = []catalogEntry{\n'
          '\t{Code: 13, Mnemonic: "ROBUST_CHANNEL_GR_EXCEPTION /\\nROBUST_CHANNEL_GR_ERROR_SW_NOTIFY", '
          'Description: "Graphics Engine Exception", ImmediateResolution: "RESTART_APP", '
          'InvestigatoryResolution: "WORKFLOW_XID_13"},\n'
          '\t{Code: 79, Mnemonic: "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", Description: "GPU has \\"fallen\\"", '
          'ImmediateResolution: "RESTART_BM", InvestigatoryResolution: "CONTACT_SUPPORT"},\n'
          '}\n\nvar nvlinkRules = []nvlinkRule{\n\t{Xid: 144, Unit: "SAW_MVB"},\n}\n')
    rows, generated = gen.parse_go_table(go)
    assert generated == "2025-10-29T00:35:32Z"
    assert [r["code"] for r in rows] == [13, 79]
    assert rows[0]["mnemonic"] == "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY"
    assert rows[1]["description"] == 'GPU has "fallen"' and rows[1]["severity"] == "critical"
    out = gen.render(rows, {"source": "s", "version": "v", "via": "x"})
    assert json.loads(out)["entries"] == rows
    # The committed table is in the generator's own format: re-rendering its rows gives the same bytes.
    doc = json.loads(TABLE.read_text())
    meta = {k: v for k, v in doc.items() if k != "entries"}
    assert gen.render(doc["entries"], meta) == TABLE.read_text()
    assert all(r["severity"] == gen.severity(r["code"], r["immediate_action"]) for r in doc["entries"])


def _xlsx(path: Path) -> None:
    """A minimal spreadsheet laid out like NVIDIA's Xid-Catalog.xlsx: a title row, the header row, two codes."""
    import zipfile

    ns = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'
    rel = 'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"'
    strings = ["Type (XID)", "Code", "Mnemonic", "Description", "Resolution Bucket (Immediate Action)",
               "Resolution Bucket (Investigatory Action)", "XID", "ROBUST_CHANNEL_GR_EXCEPTION",
               "Graphics Engine Exception", "RESTART_APP", "WORKFLOW_XID_13", "GSP_ERROR", "GSP Error", "RESET_GPU",
               "INVESTIGATE_SW"]
    sst = "".join(f"<si><t>{x}</t></si>" for x in strings)

    def row(n: int, cells: list[tuple[str, str, str]]) -> str:
        return f'<row r="{n}">' + "".join(f'<c r="{ref}{n}"{t}><v>{v}</v></c>' for ref, t, v in cells) + "</row>"

    s = ' t="s"'
    rows = ('<row r="1"><c r="A1" t="inlineStr"><is><t>Xid catalog</t></is></c></row>'
            + row(2, [(c, s, str(i)) for i, c in enumerate("ABCDEF")])
            + row(3, [("A", s, "6"), ("B", "", "13"), ("C", s, "7"), ("D", s, "8"), ("E", s, "9"), ("F", s, "10")])
            + row(4, [("A", s, "6"), ("B", "", "120"), ("C", s, "11"), ("D", s, "12"), ("E", s, "13"),
                      ("F", s, "14")]))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("xl/workbook.xml", f'<workbook {ns} {rel}><sheets><sheet name="Xids" sheetId="1" r:id="rId1"/>'
                                      "</sheets></workbook>")
        z.writestr("xl/_rels/workbook.xml.rels",
                   '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
                   '<Relationship Id="rId1" Type="worksheet" Target="worksheets/sheet1.xml"/></Relationships>')
        z.writestr("xl/sharedStrings.xml", f"<sst {ns}>{sst}</sst>")
        z.writestr("xl/worksheets/sheet1.xml", f"<worksheet {ns}><sheetData>{rows}</sheetData></worksheet>")


def test_the_generator_reads_nvidias_spreadsheet(tmp_path: Path) -> None:
    _xlsx(tmp_path / "Xid-Catalog.xlsx")
    rows = _generator().parse_xlsx(tmp_path / "Xid-Catalog.xlsx")
    assert rows == [
        {"code": 13, "mnemonic": "ROBUST_CHANNEL_GR_EXCEPTION", "description": "Graphics Engine Exception",
         "immediate_action": "RESTART_APP", "investigatory_action": "WORKFLOW_XID_13", "severity": "warning"},
        {"code": 120, "mnemonic": "GSP_ERROR", "description": "GSP Error", "immediate_action": "RESET_GPU",
         "investigatory_action": "INVESTIGATE_SW", "severity": "critical"},
    ]
    # The committed rows for those codes agree: the transcription the table came from matches the sheet's layout.
    for r in rows:
        e = xid_catalog.entry(int(str(r["code"])))
        assert e is not None
        assert (e.immediate_action, e.investigatory_action) == (r["immediate_action"], r["investigatory_action"])
