"""Issue 5, mismatched inputs: dumps that are not of the same model on the same tokens.

Two dumps of different models, of disjoint layers, of different sequence lengths or different
tokens must not yield a confident root cause: output_4 ``comparability.comparable`` is false with
reasons, and the root-cause verdict is ``inconclusive`` with no root causes. Both scripts run as
subprocesses, the root-cause one running the compare step itself.
"""
from __future__ import annotations

import json
import re
import shutil

import pytest

from fuzz.fuzz_support import ROOTCAUSE, TINY, outputs, read_doc, run_script, tiny_pair, write_doc

LAYER_RE = re.compile(r"\.layers\.(\d+)\.")


def _keep_layers(src, dst, layers):
    """Copy a dump folder keeping only the entries of the given decoder layers (and non-layer ones)."""
    shutil.copytree(src, dst)
    doc = read_doc(dst)
    data = doc.get("data")
    data[:] = [p for p in data if not (m := LAYER_RE.search(p[0])) or int(m.group(1)) in layers]
    write_doc(dst, doc)
    (dst / "construct.json").unlink(missing_ok=True)
    return dst


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mismatch")
    small = tiny_pair(root / "small")
    return {
        "small": small,
        "bigger_model": tiny_pair(root / "big", layers=3, hidden=32, intermediate=64, heads=4, head_dim=8),
        "wider_same_depth": tiny_pair(root / "wide", hidden=32, intermediate=64),
        "longer_sequence": tiny_pair(root / "long", seq_len=TINY["seq_len"] + 3),
        "other_tokens": tiny_pair(root / "seed", seed=7),
        "four_layers": tiny_pair(root / "four", layers=4),
        "root": root,
    }


CASES = {
    # name: (train, rollout) picked from the fixture; the word every reason list must contain
    "different_models": (("small", 0), ("bigger_model", 1), "layers"),
    "different_hidden_size": (("small", 0), ("wider_same_depth", 1), "differ in size"),
    "different_sequence_length": (("small", 0), ("longer_sequence", 1), "differ in size"),
    "different_tokens": (("small", 0), ("other_tokens", 1), "token ids differ"),
}


def _check(out_dir, word):
    d = outputs(out_dir)
    comp = d[4]["comparability"]
    assert comp["comparable"] is False, comp
    assert comp["reasons"] and any(word in r for r in comp["reasons"]), comp
    rep = json.loads((out_dir / "output_5_root_cause_report.json").read_text(encoding="utf-8"))
    assert rep["verdict"] == "inconclusive", rep["verdict"]
    assert rep["root_causes"] == []
    assert rep["comparability"] == comp
    assert any("not comparable" in n for n in rep["notes"]), rep["notes"]
    md = (out_dir / "output_4_module_analysis.md").read_text(encoding="utf-8")
    assert "may not be comparable" in md


@pytest.mark.parametrize("case", sorted(CASES))
def test_mismatched_dumps_are_not_comparable_and_inconclusive(pairs, tmp_path, case):
    (tname, ti), (rname, ri), word = CASES[case]
    out = tmp_path / "out"
    proc = run_script(ROOTCAUSE, pairs[tname][ti], pairs[rname][ri], out)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    _check(out, word)


def test_disjoint_layers_are_not_comparable_and_inconclusive(pairs, tmp_path):
    train = _keep_layers(pairs["four_layers"][0], tmp_path / "train", {0, 1})
    rollout = _keep_layers(pairs["four_layers"][1], tmp_path / "rollout", {2, 3})
    out = tmp_path / "out"
    proc = run_script(ROOTCAUSE, train, rollout, out)
    assert proc.returncode == 0, proc.stderr
    _check(out, "map to the rollout side")


def test_same_model_is_comparable(pairs, tmp_path):
    out = tmp_path / "out"
    proc = run_script(ROOTCAUSE, *pairs["small"], out)
    assert proc.returncode == 0, proc.stderr
    d = outputs(out)
    assert (d[4]["comparability"]["comparable"], d[4]["comparability"]["reasons"]) == (True, [])
    rep = json.loads((out / "output_5_root_cause_report.json").read_text(encoding="utf-8"))
    assert rep["verdict"] == "no_credible_divergence"
