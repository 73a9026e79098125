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
]
# Left for the published vocabulary step (issue 22 (c)): report.html is standard library only and
# parses point names itself; the root-cause triage reads a point's layer from its name.
LATER = {("a point name's layer", DC + "htmlreport.py"),
         ("a point name's layer", "rl-consistency-analysis/scripts/rootcause/triage.py")}


def _sources():
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8")


@pytest.mark.parametrize("what, pattern, owner", SPELLINGS, ids=[s[0] for s in SPELLINGS])
def test_old_spelling_is_gone(what, pattern, owner):
    found = [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}" for rel, text in _sources()
             for m in re.finditer(pattern, text) if rel != owner and (what, rel) not in LATER]
    assert found == [], what


@pytest.mark.parametrize("what, pattern, owner", [s for s in SPELLINGS if s[2]], ids=[s[0] for s in SPELLINGS if s[2]])
def test_the_owner_holds_it(what, pattern, owner):
    # A pattern that matches nowhere would pass the search above whatever the code does.
    assert re.search(pattern, (REPO / owner).read_text(encoding="utf-8")), what
