"""Each shared concept has one definition (issue 22): the source of both skills holds none of the
old local spellings. ``duplicates`` only sees runs of six lines or more; these copies were one or
two lines each, so they are searched for by pattern, each allowed only in the module that owns it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = (REPO / "dump-module-mapping-value-compare" / "scripts", REPO / "rl-consistency-analysis" / "scripts")
DC = "dump-module-mapping-value-compare/scripts/dumpcompare/"

# (what, pattern, the one file allowed to hold it)
SPELLINGS = [
    ("a config look-up of the head size or the rotary values",
     r"\b(config|cfg|conf|nested)\s*(\.get\(|\[|\.setdefault\()\s*[\"'](head_dim|rope_theta|rope_parameters|rope_scaling"
     r"|text_config)[\"']", DC + "modelconfig.py"),
    ("a relative-error helper", r"def (\w*rel_err\w*|\w*rel_l2\w*|relative)\(", DC + "arrays.py"),
    ("a relative error's convention at zero", r"if \w+ > 0 else \(0\.0 if \w+ == 0 else", DC + "arrays.py"),
    ("an integer-dtype helper", r"def \w*(is_int|int_dtype)\w*\(", DC + "dtypes.py"),
    ("an integer-dtype test by prefix", r"startswith\(\(\s*[\"'](int|uint)[\"']", DC + "dtypes.py"),
    ("a file replaced into place", r"\bos\.replace\(", DC + "atomicfile.py"),
    ("a decision by searching the prose of a reason", r"[\"'][^\"']*[\"']\s+(not\s+)?in\s+[\w.\[\]\"']*\breason\b",
     None),
    ("a merge rule parsed from its string", r"(merge|rule)\.split\(|\.merge\.startswith\(|merge or \"\"\)|merge == \"sum\"",
     None),    # arrays.merge_rule parses it
    ("the RoPE theta candidates", r"1e4,\s*1e5", DC + "replay/kernels.py"),
    ("a point name's layer", r"head\[1:\]\.isdigit\(\)", DC + "points.py"),
    # Issue 22 (c): output_4 ``vocabulary`` publishes these; readers take them from there.
    ("the status groups", r"\(\s*[\"']mismatch[\"'],\s*[\"']nonfinite[\"']\s*\)|\(\s*[\"']match[\"'],\s*[\"']drift[\"']\s*\)",
     DC + "tolerances.py"),
    ("a dtype precision ranking", r"[\"']bfloat16[\"']\s*:\s*\d+\s*[,}]", None),
    ("the words for point names", r"[\"']q_rot[\"']\s*:\s*[\"']", DC + "points.py"),
]
# Point names in the root-cause skill: only output_4 ``vocabulary.points`` says what one is made of.
ROOTCAUSE = REPO / "rl-consistency-analysis" / "scripts" / "rootcause"
POINT_PARSING = r"\.split\(\s*[\"']\+[\"']\s*\)|[\"']\+[\"']\s+(not\s+)?in\b|partition\(\s*[\"']@[\"']\s*\)|\(L\(\\d\+\)\|M\)"


def _sources():
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8")


@pytest.mark.parametrize("what, pattern, owner", SPELLINGS, ids=[s[0] for s in SPELLINGS])
def test_old_spelling_is_gone(what, pattern, owner):
    found = [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}" for rel, text in _sources()
             for m in re.finditer(pattern, text) if rel != owner]
    assert found == [], what


@pytest.mark.parametrize("what, pattern, owner", [s for s in SPELLINGS if s[2]], ids=[s[0] for s in SPELLINGS if s[2]])
def test_the_owner_holds_it(what, pattern, owner):
    # A pattern that matches nowhere would pass the search above whatever the code does.
    assert re.search(pattern, (REPO / owner).read_text(encoding="utf-8")), what


def test_the_root_cause_skill_parses_no_point_name():
    found = [f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}" for path in sorted(ROOTCAUSE.glob("*.py"))
             for text in [path.read_text(encoding="utf-8")] for m in re.finditer(POINT_PARSING, text)]
    assert found == []


def test_the_point_parsing_search_sees_each_form():
    src = 'a.split("+")\nif "+" in p:\nname.partition("@")\nre.compile(r"^(L(\\d+)|M)\\.(.+)$")\n'
    assert len(list(re.finditer(POINT_PARSING, src))) == 4
