"""Names from a dump are untrusted text (issue 18): a real msprobe dump pair whose module names are
formulas, markup, pipes, ANSI escapes and a right-to-left override, run through both scripts.

Every CSV cell, every markdown table row and every stdout line is checked for the form its viewer
would execute or mis-render; the JSON outputs must still hold the exact names. The pair is the
committed real msprobe run (tests/data/msprobe/llama_L0_statistics) and its copy with noise on
``model.layers.1.mlp.down_proj.weight``, so the hostile name given to that module is the root cause.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from dumpcompare import safetext

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "msprobe"
COMPARE = ROOT / "dump-module-mapping-value-compare" / "scripts" / "run_compare.py"
ROOTCAUSE = ROOT / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
CULPRIT = "model.layers.1.mlp.down_proj"   # the module whose weight differs in the perturbed copy

FORMULA = '=HYPERLINK("http://x","y")'
SUM = "@SUM(1+1)*cmd|x"
SCRIPT_TAG = "x<script>alert(1)</script>"
PIPES = "a|b`c`"
ANSI = "\x1b[31mred\x1b[0m\rover"
RTL = "\u202eevil.txt"
PLUS = "+cmd"
MINUS = "-2+3"
QUOTED = "'=already quoted"
HOSTILE = (FORMULA, SUM, SCRIPT_TAG, PIPES, ANSI, RTL, PLUS, MINUS, QUOTED)
# Modules renamed on both sides; CULPRIT takes the name under test.
OTHERS = ("model.layers.0.self_attn.o_proj", "model.layers.0.mlp.down_proj", "model.layers.1.mlp.up_proj",
          "model.layers.1.self_attn.o_proj", "model.layers.1.input_layernorm", "model.layers.0.mlp.up_proj",
          "model.layers.0.input_layernorm", "model.layers.1.self_attn.q_proj")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _renamer(mapping: dict[str, str]):
    def ren(text: str) -> str:
        for old, new in mapping.items():
            text = text.replace(f"Module.{old}.", f"Module.{new}.")
        return text

    def walk(obj):
        if isinstance(obj, dict):
            return {ren(k): walk(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        return ren(obj) if isinstance(obj, str) else obj
    return walk


def hostile_pair(root: Path, culprit_name: str) -> dict[str, str]:
    """Write the renamed real pair under ``root``; returns the renames (old path -> hostile name)."""
    others = [n for n in HOSTILE if n != culprit_name]
    mapping = {CULPRIT: culprit_name, **dict(zip(OTHERS, others))}
    walk = _renamer(mapping)
    for side, name in (("train", "llama_L0_statistics"), ("rollout", "llama_L0_statistics_perturbed")):
        for src in (DATA / name).rglob("*.json"):
            dst = root / side / src.relative_to(DATA / name)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(json.dumps(walk(json.loads(src.read_text(encoding="utf-8"))), indent=1),
                           encoding="utf-8")
    return mapping


def _run(script: Path, pair: Path, out: Path) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, str(script), "--train", str(pair / "train"), "--rollout",
                          str(pair / "rollout"), "--out-dir", str(out)],
                         capture_output=True, text=True, encoding="utf-8", timeout=300)
    assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module", params=[FORMULA, ANSI, RTL, SCRIPT_TAG], ids=["formula", "ansi", "rtl", "script"])
def runs(request, tmp_path_factory):
    """Both scripts on one hostile pair whose root-cause module carries the name under test."""
    root = tmp_path_factory.mktemp("hostile")
    mapping = hostile_pair(root / "pair", request.param)
    compare = _run(COMPARE, root / "pair", root / "compare")
    rootcause = _run(ROOTCAUSE, root / "pair", root / "rootcause")
    return {"name": request.param, "mapping": mapping, "compare": compare, "rootcause": rootcause,
            "outs": (root / "compare", root / "rootcause")}


def _invisible(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") and c != "\n"]


def test_every_csv_cell_is_neutralised_and_strips_back_to_the_exact_name(runs):
    for out in runs["outs"]:
        seen = set()
        for path in sorted(out.glob("output_*.csv")):
            with path.open(encoding="utf-8", newline="") as fh:
                for row in csv.reader(fh):
                    for cell in row:
                        if cell.startswith(FORMULA_START):
                            float(cell)   # only numbers may start like a formula
                        seen.add(cell[1:] if cell.startswith("'") else cell)
        # A reader that strips the one leading apostrophe gets every renamed path back exactly.
        assert set(runs["mapping"].values()) <= seen
    rows = list(csv.DictReader((runs["outs"][0] / "output_1_key_mapping.csv").open(encoding="utf-8", newline="")))
    paths = {r["path"] for r in rows}
    assert {"'" + n for n in (FORMULA, SUM, PLUS, MINUS, QUOTED)} <= paths
    assert SCRIPT_TAG in paths and "'" + SCRIPT_TAG not in paths   # only formula starts are changed


def _unescaped(text: str) -> str:
    """The characters of markdown ``text`` that no backslash escapes (what a viewer reads as markup)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _cells(row: str) -> int:
    """Columns of a markdown table row: pipes not escaped by a backslash, minus the outer two."""
    return _unescaped(row).count("|") - 1


def test_markdown_tables_keep_their_columns_and_hold_no_markup(runs):
    for out in runs["outs"]:
        md = (out / "output_4_module_analysis.md").read_text(encoding="utf-8")
        table = [ln for ln in md.splitlines() if ln.startswith("|")]
        assert len(table) > 20
        assert {_cells(ln) for ln in table} == {10}
        assert not set("<>[]`") & set(_unescaped(md).replace("`sources`", "")) and not _invisible(md)
        # Each hostile module is one row, its name escaped in both module columns.
        for name in runs["mapping"].values():
            esc = safetext.markdown(name)
            assert sum(f"| {esc} | {esc} |" in ln for ln in table) == 1, name
    md = (runs["outs"][0] / "output_4_module_analysis.md").read_text(encoding="utf-8")
    head = md.split("## Every mapped pair")[0]
    assert f"**First divergence:** {safetext.markdown(runs['name'])} (train)" in head


def test_stdout_of_both_scripts_carries_no_control_character(runs):
    name = runs["name"]
    for res in (runs["compare"], runs["rootcause"]):
        assert not _invisible(res.stdout), res.stdout
        assert safetext.visible(name) in res.stdout
    lines = runs["rootcause"].stdout.splitlines()
    assert any(ln.startswith("root cause: a weight differs (parameters or checkpoint) at " + safetext.visible(name)
                             + " (train)") for ln in lines)
    assert any(ln.startswith("first divergence: " + safetext.visible(name)) for ln in
               runs["compare"].stdout.splitlines())


def test_report_html_escapes_every_name_and_builds_nothing_from_them(runs):
    """report.html of both scripts: the name shows escaped, no raw markup, no control character,
    and no attribute or URL carries dump text."""
    import html as _html
    from html.parser import HTMLParser

    class Collect(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags, self.attrs = [], []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            self.attrs += [v or "" for _, v in attrs]

    name = runs["name"]
    for out in runs["outs"]:
        page = (out / "report.html").read_text(encoding="utf-8")
        assert not _invisible(page)
        assert "<script" not in page.lower()
        assert safetext.html(name) in page
        parsed = Collect()
        parsed.feed(page)
        assert "script" not in parsed.tags
        assert not any(_html.unescape(safetext.html(name)) in v or safetext.html(name) in v for v in parsed.attrs)


def test_json_outputs_hold_the_exact_names(runs):
    compare, rootcause = runs["outs"]
    d1 = json.loads((compare / "output_1_key_mapping.json").read_text(encoding="utf-8"))
    assert set(runs["mapping"].values()) <= {r["path"] for r in d1["train"]}
    d5 = json.loads((rootcause / "output_5_root_cause_report.json").read_text(encoding="utf-8"))
    top = d5["root_causes"][0]
    assert (top["category"], top["train_module"], top["rollout_module"]) == (
        "parameter_or_checkpoint_issue", runs["name"], runs["name"])
    d4 = json.loads((compare / "output_4_module_analysis.json").read_text(encoding="utf-8"))
    assert d4["first_divergence"]["train_modules"] == [runs["name"]]


# --- the safe forms themselves ---------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [
    ("=1+1", "'=1+1"), ("+cmd", "'+cmd"), ("-x", "'-x"), ("@SUM(A1)", "'@SUM(A1)"), ("\tx", "'\tx"),
    ("\rx", "'\rx"), ("-1.5", "-1.5"), ("+2e-3", "+2e-3"), ("-Infinity", "-Infinity"), ("NaN", "NaN"),
    ("model.x", "model.x"), ("'=x", "''=x"), ("'a", "''a"), (-3, -3), (0.5, 0.5), ("", "")])
def test_csv_cell(value, expected):
    assert safetext.csv_cell(value) == expected


def test_visible_escapes_controls_bidi_and_separators_only():
    assert safetext.visible("model.layers.0.mlp") == "model.layers.0.mlp"
    assert safetext.visible("a\x1b[2Jb\rc\nd\x7f\x9b") == "a\\x1b[2Jb\\x0dc\\x0ad\\x7f\\x9b"
    assert safetext.visible("\u202ex\u2066\u200b\u2028") == "\\u202ex\\u2066\\u200b\\u2028"
    assert safetext.visible("名前.層") == "名前.層"


def test_markdown_form_keeps_one_cell_on_one_line():
    text = safetext.markdown("a|b`c`\nd[x](javascript:y)<i>&amp;\\")
    assert "\n" not in text and _cells(f"| {text} |") == 1
    assert text == "a\\|b\\`c\\`\\\\x0ad\\[x\\](javascript:y)\\<i\\>\\&amp;\\\\"


def test_html_form_escapes_markup_quotes_and_bidi():
    assert safetext.html('x<script>alert("1")</script>\'&\u202e') == (
        "x&lt;script&gt;alert(&quot;1&quot;)&lt;/script&gt;&#x27;&amp;\\u202e")
