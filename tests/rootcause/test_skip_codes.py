"""Typed skip records (issue 22, item 2): every comparison that did not happen carries a code from
the one list published in output_schemas.md ("Skip codes"), and readers decide by that code, not
by the prose next to it."""
from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dumpcompare.compare import Result
from dumpcompare.documents import activations_compared, comparability
from dumpcompare.skips import SKIP_CODES, Skip

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "dump-module-mapping-value-compare" / "references" / "output_schemas.md"
SCRIPT = REPO / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
TENSOR = REPO / "tests" / "data" / "real" / "llama_tp1_tensor_stale_rollout"
OUT3 = "output_3_value_compare.json"
REPORT = "output_5_root_cause_report.json"


def _published() -> list[str]:
    """The codes of the "Skip codes" table (first column), in the page's order."""
    after = SCHEMAS.read_text(encoding="utf-8").split("### Skip codes", 1)[1].splitlines()
    start = next(i for i, line in enumerate(after) if line.startswith("|"))
    end = next((i for i, line in enumerate(after[start:]) if not line.startswith("|")), len(after) - start)
    return [m.group(1) for line in after[start:start + end] if (m := re.match(r"^\| `(\w+)` \|", line))]


def _emitted(doc) -> set[str]:
    """Every ``skip.code`` anywhere in a JSON document."""
    found = set()
    if isinstance(doc, dict):
        if isinstance(doc.get("skip"), dict):
            found.add(doc["skip"].get("code"))
        for v in doc.values():
            found |= _emitted(v)
    elif isinstance(doc, list):
        for v in doc:
            found |= _emitted(v)
    return found


def _run(out: Path, *argv) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, argv), "--out-dir", str(out)],
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def tensors_gone(tmp_path_factory) -> Path:
    """A tensor-mode pair whose rollout tensor files were deleted, run once: its out-dir."""
    root = tmp_path_factory.mktemp("skips")
    shutil.copytree(TENSOR, root / "pair")
    for p in (root / "pair" / "rollout").rglob("*.pt"):
        p.unlink()
    code, _, err = _run(root / "o", "--train", root / "pair" / "train", "--rollout", root / "pair" / "rollout")
    assert code == 0, err
    return root / "o"


def test_the_published_list_is_the_code_list():
    published = _published()
    assert len(published) == len(set(published))
    assert set(published) == set(SKIP_CODES)


def test_a_code_outside_the_list_is_refused():
    with pytest.raises(TypeError):
        Skip("shape mismatch", "prose is not a code")


def test_every_code_a_run_writes_is_published(tensors_gone):
    emitted = set()
    for name in ("output_3_value_compare.json", "output_4_module_analysis.json"):
        emitted |= _emitted(json.loads((tensors_gone / name).read_text(encoding="utf-8")))
    # The injected fault: the rollout's tensor files are gone.
    assert "tensor_unavailable" in emitted
    assert emitted <= set(_published())


def test_every_code_the_source_names_is_published():
    """Each literal code passed to Skip, Result.skipped or refforward._not_run is in the list."""
    named = set()
    for path in (REPO / "dump-module-mapping-value-compare" / "scripts" / "dumpcompare").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if fn in ("Skip", "skipped", "_not_run"):
                    named.add(node.args[0].value)
    assert len(named) >= 15 and named <= set(_published())


def _reuse(out: Path) -> str:
    code, _, err = _run(out, "--train", "unused-train", "--rollout", "unused-rollout", "--reuse-outputs",
                        "--quiet")
    assert code == 0, err
    return " ".join(json.loads((out / REPORT).read_text(encoding="utf-8"))["notes"])


def test_the_tensor_files_note_follows_the_code_not_the_prose(tensors_gone, tmp_path):
    results = json.loads((tensors_gone / OUT3).read_text(encoding="utf-8"))["results"]
    assert all(r["skip"]["code"] == "tensor_unavailable" for r in results)
    assert f"{len(results)} of {len(results)} comparisons" in _reuse(_copy(tensors_gone, tmp_path / "same"))

    # Only the first result keeps the code; every note keeps its "tensor unavailable" prose.
    edited = _copy(tensors_gone, tmp_path / "one")
    _edit_codes(edited, lambda i, code: code if i == 0 else "layout")
    assert f"1 of {len(results)} comparisons" in _reuse(edited)

    edited = _copy(tensors_gone, tmp_path / "none")
    _edit_codes(edited, lambda i, code: "layout")
    assert "tensor files missing" not in _reuse(edited)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_codes(out: Path, new_code) -> None:
    doc = json.loads((out / OUT3).read_text(encoding="utf-8"))
    for i, r in enumerate(doc["results"]):
        r["skip"]["code"] = new_code(i, r["skip"]["code"])
    (out / OUT3).write_text(json.dumps(doc), encoding="utf-8")


def _result(cid: str, point: str, skip: Skip | None) -> Result:
    side = {"modules": ["m"], "dtypes": ["float32"], "shapes": [[4]]}
    res = Result(cid, point, "direct", "features", "statistics", "incomparable" if skip else "match",
                 None if skip else 0.0, None, None, dict(side), dict(side))
    if skip:
        res.skipped(skip.code, skip.reason)
    return res


SUMMARY = {"train_modules": 4, "rollout_modules": 4, "mapped_train_modules": 4, "train_coverage": 1.0, "pairs": 4}


def test_comparability_reads_the_size_codes():
    prose = "the same words for every record"
    sized = [_result(f"c{i}", f"L{i}.mlp.out", Skip("shape_conflict", prose)) for i in range(3)]
    ran = [_result("c9", "L9.mlp.out", None)]
    comp = comparability(sized + ran, SUMMARY, {"train": 2, "rollout": 2})
    assert comp["codes"] == ["sizes"] and not comp["comparable"]
    acts = activations_compared(sized + ran)
    assert acts["compared"] == 1 and acts["main_skip"] == Skip("shape_conflict", prose)

    # Same prose, another code: not a size difference any more.
    other = [_result(r.cid, r.point, Skip("layout", prose)) for r in sized]
    comp = comparability(other + ran, SUMMARY, {"train": 2, "rollout": 2})
    assert comp["codes"] == [] and comp["comparable"]
    assert activations_compared(other + ran)["main_skip"].code == "layout"


def test_nothing_compared_is_found_by_its_code():
    from rootcause import answer
    prose = "nothing was compared (0 module pairs)"

    def nothing(code: str):
        doc = {"verdict": "inconclusive", "root_causes": [],
               "comparability": {"comparable": False, "reasons": [prose], "codes": [code]}}
        return answer.build(doc, [], [])["nothing_compared"]
    assert nothing("nothing_compared") == prose
    assert nothing("coverage") is None
