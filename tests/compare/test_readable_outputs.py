"""Readable outputs (issue 13, item 3): small JSON outputs indented, large ones compact, and
output_4's markdown starting with what an agent needs first."""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field

from compare.test_compare_support import OUTPUT_JSON, synth_dirs  # noqa: F401 (fixture)
from dumpcompare import htmlreport, outputs
from synth import faults as F


def test_small_json_outputs_are_indented_and_exact(tmp_path):
    doc = {"name": '=HYPERLINK("x")\u202e', "value": 1.5, "bad": float("nan"), "list": [1, 2]}
    outputs.write_json(tmp_path / "a.json", doc)
    text = (tmp_path / "a.json").read_text(encoding="utf-8")
    assert text.startswith('{\n "schema_version": "2.1",\n "name": ')
    assert json.loads(text) == {"schema_version": "2.1", **doc, "bad": "NaN"}


def test_json_outputs_above_the_threshold_are_compact_with_a_record_per_line(tmp_path, monkeypatch):
    doc = {"results": [{"cid": i, "error": i / 7} for i in range(50)], "bad": float("inf")}
    outputs.write_json(tmp_path / "small.json", doc)
    size = len((tmp_path / "small.json").read_text().splitlines())
    assert size > 100
    monkeypatch.setattr(outputs, "INDENT_MAX_CHARS", 1000)
    outputs.write_json(tmp_path / "big.json", doc)
    lines = (tmp_path / "big.json").read_text().splitlines()
    # The document's members and each record of its long list on a line of their own.
    assert lines[:3] == ["{", '"schema_version":"2.1",', '"results":[']
    assert lines[3:53] == [json.dumps({"cid": i, "error": i / 7}, separators=(",", ":")) + ","[:i < 49]
                           for i in range(50)]
    assert lines[53:] == ["],", '"bad":"Infinity"', "}"]
    assert json.loads("\n".join(lines)) == json.loads((tmp_path / "small.json").read_text())


def test_outputs_are_indented_and_markdown_starts_with_the_finding(synth_dirs):
    out, _, _ = synth_dirs(layers=4, faults=[F.CorruptWeight("rollout", "gate", 2)])
    for name in OUTPUT_JSON:
        assert (out.dir / name).read_text().count("\n") > 100, name
    md = (out.dir / "output_4_module_analysis.md").read_text()
    lines = [ln for ln in md.splitlines() if ln]
    assert lines[0] == "# Module analysis (output_4)"
    assert lines[1].startswith("**Verdict:** ")
    assert lines[2].startswith("**First divergence:** model.layers.2.mlp.gate_proj, model.layers.2.mlp.up_proj "
                               "(train) / model.layers.2.mlp.gate_up_proj (rollout)")
    assert lines[3].startswith("**Top candidates**")
    top = out.ranked()
    assert [ln for ln in lines if ln[0].isdigit()] == [
        f"{i}. rank {m['module_priority_rank']}, pair {m['pid']}: {', '.join(m['train_modules'])} (train) / "
        f"{', '.join(m['rollout_modules'])} (rollout): {m['status']} ({m['rank_reason']})"
        for i, m in enumerate(top[:5], 1)]
    assert "model.layers.2.mlp.gate_up_proj" in lines[4]
    assert md.index("**Top candidates**") < md.index("| rank | pair |")


@dataclass
class _Record:
    cid: str
    error: float | None
    parts: tuple
    hidden: str = field(default="x", metadata={"written": False})


def test_large_outputs_are_written_record_by_record_as_one_pass_would_write_them(tmp_path, monkeypatch):
    """The streamed compact form is json.dumps's text of the cleaned document: a NaN in one record
    is written as "NaN" there, lazy Records are lists, unwritten fields stay out."""
    monkeypatch.setattr(outputs, "INDENT_MAX_CHARS", 100)
    recs = [_Record(f"c{i}", i / 3 if i != 7 else float("nan"), (i, "ü\u202e")) for i in range(40)]
    doc = {"results": recs, "rows": outputs.Records(lambda r: {"cid": r.cid, "e": r.error}, recs),
           "empty": [], "none": {}, "summary": {"inf": float("-inf"), "n": 3}, "top": float("nan")}
    outputs.write_json(tmp_path / "big.json", doc)
    text = (tmp_path / "big.json").read_text(encoding="utf-8")
    body = {"schema_version": outputs.SCHEMA_VERSION, **doc, "rows": list(doc["rows"])}
    # Newlines stand between tokens only: without them the text is the one-pass compact text.
    assert text.replace("\n", "") == json.dumps(outputs.clean(body), ensure_ascii=False, allow_nan=False,
                                                separators=(",", ":"))
    assert text.splitlines()[1:4] == ['"schema_version":"2.1",', '"results":[', '{"cid":"c0","error":0.0,"parts":[0,"ü\u202e"]},']
    back = json.loads(text)
    assert back["results"][7] == {"cid": "c7", "error": "NaN", "parts": [7, "ü\u202e"]}
    assert back["results"][6]["error"] == 2.0 and back["rows"][7] == {"cid": "c7", "e": "NaN"}
    assert back["summary"] == {"inf": "-Infinity", "n": 3} and back["top"] == "NaN"


def test_the_report_reads_the_results_as_the_written_outputs_hold_them(synth_dirs):
    """report.html of a run is the page the written output_3/output_4 give (what the root-cause
    skill renders from): the lazily cleaned views read as the cleaned documents."""
    out, _, _ = synth_dirs(layers=4, faults=[F.CorruptWeight("rollout", "gate", 2)])
    doc3, doc4, doc1 = (json.loads((out.dir / n).read_text()) for n in (
        "output_3_value_compare.json", "output_4_module_analysis.json", "output_1_key_mapping.json"))
    assert any(r["status"] not in ("match", "drift") for r in doc3["results"])
    page = (out.dir / htmlreport.REPORT).read_text(encoding="utf-8")
    assert page == "".join(htmlreport.pieces(doc3, doc4, doc1["sources"]))


def test_csv_cells_of_every_kind_are_written_as_the_one_rule_gives_them(tmp_path):
    """The per-type fast path of the CSV writer keeps safetext.csv_cell's rule and the list,
    non-finite and float forms (hostile names get the apostrophe, numbers written as text do not)."""
    row = ["=cmd", "-1.5", "'x", "plain", "", 3, True, None, 0.1234567, float("nan"), float("-inf"),
           ["a", "=b"], ["=a", "b"], [[64, 64], [32, 64]], [None, "x"], (1, 2.5), [float("inf")]]
    outputs.write_csv(tmp_path / "v.csv", [f"c{i}" for i in range(len(row))], [row])
    with open(tmp_path / "v.csv", newline="", encoding="utf-8") as fh:
        got = list(csv.reader(fh))[1]
    assert got == ["'=cmd", "-1.5", "''x", "plain", "", "3", "True", "", "0.123457", "NaN", "-Infinity",
                   "a;=b", "'=a;b", "64;64;32;64", ";x", "1;2.5", "Infinity"]


def test_a_lazy_members_table_is_written_and_read_as_the_dict_it_stands_for(tmp_path, monkeypatch):
    """outputs.Members (output_4 vocabulary.points) makes each value when written or read: the
    small (indented) and large (a member per line) files and the report's view hold the same dict."""
    made = []

    def form(key):
        made.append(key)
        return {"name": key, "x": float("nan") if key == "b" else len(key)}
    table = outputs.Members(form, ["a", "b", "cc"])
    assert "a" in table and "zz" not in outputs.clean_view({"t": table})["t"] and not made   # asked, not made
    want = {"a": {"name": "a", "x": 1}, "b": {"name": "b", "x": "NaN"}, "cc": {"name": "cc", "x": 2}}
    outputs.write_json(tmp_path / "small.json", {"vocabulary": {"points": table}})
    monkeypatch.setattr(outputs, "INDENT_MAX_CHARS", 10)
    outputs.write_json(tmp_path / "big.json", {"vocabulary": {"points": table}})
    big = (tmp_path / "big.json").read_text(encoding="utf-8")
    for name in ("small.json", "big.json"):
        assert json.loads((tmp_path / name).read_text(encoding="utf-8"))["vocabulary"]["points"] == want
    assert '\n"cc":{"name":"cc","x":2}\n' in big
    view = outputs.clean_view({"points": table})["points"]
    assert dict(view.items()) == want and view.get("zz") is None
    assert made and "zz" not in made
