"""One owner of what the module_priority_rank values mean: the compare skill (analysis.RANK_MEANINGS,
published in output_4 ``rank_meanings``); its rules page says the same, and the root-cause
skill's glossary reads output_4 instead of its own wording."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from dumpcompare.analysis import RANK_MEANINGS
from real.corpus_check import CORPUS, REPORT, run_pair

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "dump-module-mapping-value-compare" / "references" / "priority_rank.md"
STATUSES = ("parameter_mismatch", "propagated", "origin", "structural", "incomparable", "clean")
OUT4 = "output_4_module_analysis.json"


def _documented() -> dict[int, set[str]]:
    """rank -> statuses, from the rules table of priority_rank.md (``| # | condition | status | rank |``)."""
    ranks: dict[int, set[str]] = {}
    for line in RULES.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\|\s*\d+\s*\|.*\|\s*`(\w+)`\s*\|\s*(\d)\s*\|$", line)
        if m:
            ranks.setdefault(int(m.group(2)), set()).add(m.group(1))
    return ranks


def test_published_meanings_name_the_statuses_the_rules_give_each_rank():
    documented = _documented()
    assert sorted(documented) == sorted(RANK_MEANINGS) == [1, 2, 3, 4, 5]
    for rank, text in RANK_MEANINGS.items():
        named = {s for s in STATUSES if re.search(rf"\b{s}\b", text)}
        assert named == documented[rank], rank


def test_the_root_cause_glossary_follows_output_4(tmp_path):
    name = "llama_tp1_fp32_clean"
    first = tmp_path / "first"
    code, err, doc = run_pair(CORPUS / name / "train", CORPUS / name / "rollout", first)
    assert code == 0, err
    line = doc["glossary"]["fields"]["module_priority_rank"]
    assert all(f"{k} {v}" in line for k, v in RANK_MEANINGS.items())
    assert "drift only" not in line

    edited = tmp_path / "edited"
    shutil.copytree(first, edited)
    doc4 = json.loads((edited / OUT4).read_text(encoding="utf-8"))
    doc4["rank_meanings"]["4"] = "an edited meaning of rank four"
    (edited / OUT4).write_text(json.dumps(doc4), encoding="utf-8")
    code, err, _ = run_pair("unused-train", "unused-rollout", edited, "--reuse-outputs")
    assert code == 0, err
    line = json.loads((edited / REPORT).read_text(encoding="utf-8"))["glossary"]["fields"]["module_priority_rank"]
    assert "4 an edited meaning of rank four" in line and RANK_MEANINGS[4] not in line
