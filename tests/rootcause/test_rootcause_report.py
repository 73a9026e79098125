"""Shape of output_5: keys, hypotheses and next checks, confidence and its credence word,
upstream_propagation after a root cause, ranking, terminal summary.

The cases are the same as in test_rootcause_categories.py, so the session cache of ``analyze``
usually makes these tests free.
"""
import json
import math

import pytest

from synth import faults as F

TOP_KEYS = {"schema_version", "verdict", "root_causes", "suppressed", "first_divergence", "other_candidates",
            "precision", "notes", "partial", "comparability", "mode", "inputs", "summary"}
CAUSE_KEYS = {"rank", "category", "side", "side_reason", "train_module", "rollout_module", "layer", "role",
              "confidence", "confidence_word", "confidence_notes", "evidence", "hypotheses", "next_checks",
              "rules_fired"}
CATEGORIES = {"structural_false_positive", "missing_or_extra_op_between_aligned_boundary",
              "parameter_or_checkpoint_issue", "in_module_impl_difference", "upstream_propagation"}
VERDICTS = {"root_cause_found", "precision_only", "no_credible_divergence", "inconclusive"}

# The credence scale of the issue, written out independently of rootcause.credence.
SCALE = [(86, 99, "almost certain"), (71, 85, "highly likely"), (56, 70, "likely"), (46, 55, "even"),
         (31, 45, "unlikely"), (16, 30, "highly unlikely"), (1, 15, "remote")]


def expected_word(confidence: float) -> str:
    pct = round(confidence * 100)
    return next(w for lo, hi, w in SCALE if lo <= pct <= hi)


CASES = {
    "corrupt": dict(faults=[F.CorruptWeight("rollout", "gate", 1)]),
    "corrupt_down": dict(faults=[F.CorruptWeight("train", "down", 0)]),
    "permute": dict(faults=[F.PermuteQKV("rollout", 1)]),
    "eps": dict(faults=[F.NormEps("train", 1e-2, layer=3)]),
    "rope": dict(faults=[F.RopeTheta("rollout", 500.0)]),
    "act": dict(faults=[F.Activation("rollout", "gelu_tanh")]),
    "no_act": dict(faults=[F.MissingActivation("train", 1)]),
    "extra_op": dict(faults=[F.ExtraOp("rollout", 2)]),
    "bf16_lm_head": dict(faults=[F.HalfPrecision("train", "lm_head")]),
    "bf16_all": dict(faults=[F.HalfPrecision("rollout", "all")]),
    "megatron": dict(faults=[F.CorruptWeight("train", "down", 1)], train_layout="megatron"),
    "clean": dict(faults=[F.KernelNoise("train", 1e-6, 0), F.KernelNoise("rollout", 1e-6, 1)]),
}
FAULTY = [k for k in CASES if k not in ("clean", "bf16_all")]


def strict_json(path):
    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(path.read_text(encoding="utf-8"), parse_constant=reject)


@pytest.mark.parametrize("case", list(CASES))
def test_report_keys_and_values(analyze, case):
    res = analyze(**CASES[case])
    doc = strict_json(res.out / "output_5_root_cause_report.json")
    assert TOP_KEYS <= set(doc)
    assert doc["schema_version"].split(".")[0] == "3"
    assert doc["verdict"] in VERDICTS
    assert doc["mode"] == "statistics"
    assert doc["partial"] is False
    assert doc["inputs"]["train"] == str(res.train) and doc["inputs"]["rollout"] == str(res.rollout)
    for f in doc["root_causes"]:
        assert CAUSE_KEYS <= set(f), CAUSE_KEYS - set(f)
        assert f["category"] in CATEGORIES - {"upstream_propagation", "structural_false_positive"}
        assert f["side"] in ("train", "rollout", "both", "undetermined")
        for k in ("train_module", "rollout_module"):
            v = f[k]
            assert v is None or isinstance(v, str) or (isinstance(v, list) and len(v) > 1 and all(
                isinstance(x, str) for x in v)), v
            for name in ([v] if isinstance(v, str) else v or []):
                assert not name.startswith("Module.") and ".forward" not in name, name
        assert f["train_module"] is not None or f["rollout_module"] is not None
    for f in doc["other_candidates"]:
        assert f["category"] in CATEGORIES
    # the script writes the JSON evidence only: output_1..4 regenerated, the markdown is the agent's
    names = {p.name for p in res.out.iterdir()}
    assert {"output_1_key_mapping.json", "output_2_mapping.json", "output_3_value_compare.json",
            "output_4_module_analysis.json", "output_5_root_cause_report.json"} <= names
    assert "output_5_root_cause_report.md" not in names
    assert not [n for n in names if n.endswith(".tmp")]


@pytest.mark.parametrize("case", FAULTY)
def test_each_root_cause_has_hypotheses_and_next_checks(analyze, case):
    doc = analyze(**CASES[case]).doc
    assert doc["root_causes"]
    for f in doc["root_causes"]:
        assert len(f["hypotheses"]) >= 2, f["hypotheses"]
        for h in f["hypotheses"]:
            assert set(h) >= {"statement", "confirm_if", "refute_if"}
            assert all(isinstance(h[k], str) and h[k].strip() for k in ("statement", "confirm_if", "refute_if"))
        assert f["next_checks"] and all(isinstance(c["check"], str) and c["check"].strip() for c in f["next_checks"])
        # beside the prose, the command that runs the check (an argument list), or null
        assert all(c["command"] is None or (isinstance(c["command"], list) and all(isinstance(a, str)
                                                                                   for a in c["command"]))
                   for c in f["next_checks"])


@pytest.mark.parametrize("case", list(CASES))
def test_confidence_and_credence_word(analyze, case):
    doc = analyze(**CASES[case]).doc
    for f in doc["root_causes"] + doc["other_candidates"]:
        c = f["confidence"]
        assert isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c)
        assert 0 <= c <= 1
        # a word only where the finding's bin of fired rules is calibrated (references/calibration.md)
        from rootcause import credence
        calibrated = credence.bin_key(f["rules_fired"]) in credence.calibrated_bins()
        assert f["confidence_word"] == (expected_word(c) if calibrated else "uncalibrated"), (c, f["confidence_word"])


def test_calibration_table_gives_words_only_to_bins_of_twenty():
    import json
    from rootcause import credence
    doc = json.loads(credence.CALIBRATION_FILE.read_text(encoding="utf-8"))
    assert doc["min_findings"] == 20
    big = {k for k, b in doc["bins"].items() if b["findings"] >= 20}
    assert credence.calibrated_bins() == big
    assert all(b["right"] <= b["findings"] for b in doc["bins"].values())
    assert credence.calibrated_word(0.9, ["parameters_differ"]) == ("almost certain" if "parameters_differ" in big
                                                                   else "uncalibrated")
    assert credence.calibrated_word(0.9, ["no_such_rule"]) == "uncalibrated"
    # the table names rows that exist: rerun tools/calibrate_rules.py when rules.py changes
    from rootcause import rules
    ids = {r.id for r in rules.RULES + (rules.PROPAGATION, rules.BEFORE_RANGE, rules.PROPAGATION_EXAMPLE)}
    ids |= {a.id for a in rules.ADJUSTMENTS}
    assert {part for k in doc["bins"] for part in k.split("+")} <= ids


@pytest.mark.parametrize("case", FAULTY)
def test_ranks_follow_confidence(analyze, case):
    causes = analyze(**CASES[case]).doc["root_causes"]
    assert [f["rank"] for f in causes] == list(range(1, len(causes) + 1))
    confs = [f["confidence"] for f in causes]
    assert confs == sorted(confs, reverse=True)


@pytest.mark.parametrize("case", ["corrupt", "corrupt_down", "no_act", "megatron"])
def test_upstream_propagation_follows_the_root_cause(analyze, case):
    doc = analyze(**CASES[case]).doc
    rc = doc["root_causes"][0]
    prop = [f for f in doc["other_candidates"] if f["category"] == "upstream_propagation"]
    assert prop, "modules that only carry the divergence are listed as upstream_propagation"
    mine = [f for f in prop if f["evidence"].get("explained_by") == rc["evidence"]["pair"]]
    assert mine
    assert all(f["layer"] is None or f["layer"] >= rc["layer"] for f in mine)
    # propagation is never reported as a root cause
    assert all(f["category"] != "upstream_propagation" for f in doc["root_causes"])


def test_upstream_propagation_candidates_have_diverged_inputs(analyze):
    doc = analyze(**CASES["corrupt_down"]).doc
    prop = [f for f in doc["other_candidates"] if f["category"] == "upstream_propagation"]
    assert prop
    assert [f["train_module"] for f in prop if f["evidence"]["input_status"] not in ("mismatch", "nonfinite")] == []


def test_first_divergence_points_at_the_fault(analyze):
    doc = analyze(**CASES["corrupt_down"]).doc
    fd = doc["first_divergence"]
    assert fd["train_modules"] == ["model.layers.0.mlp.down_proj"]
    assert fd["pair"] == doc["root_causes"][0]["evidence"]["pair"]


def test_clean_pair_has_no_first_divergence(analyze):
    fd = analyze(**CASES["clean"]).doc["first_divergence"]
    assert fd is None or fd.get("pair") is None


def test_terminal_summary(analyze):
    res = analyze(**CASES["no_act"])
    lines = res.stdout.strip().splitlines()
    # the answer first: verdict, root cause, side, confidence, next check; the files last
    assert lines[0] == "verdict: root cause found"
    assert lines[1].startswith("root cause: an operation runs on one side only at ") and "model.layers.1.mlp.act_fn" in lines[1]
    assert lines[2].startswith("side: rollout: ")
    assert lines[3].startswith("confidence: ")
    assert lines[4].startswith("next check: ")
    assert lines[-2].startswith("report: ") and lines[-1].startswith("evidence (JSON): ")
    assert "output_5_root_cause_report.json" in res.stdout
    assert len(lines) < 15, "a short summary, not the report"


def test_terminal_summary_precision_only(analyze):
    res = analyze(**CASES["bf16_all"])
    assert res.stdout.splitlines()[0].startswith("verdict: only precision differences")
    assert "root cause:" not in res.stdout


@pytest.mark.parametrize("pct,word", [(99, "almost certain"), (86, "almost certain"), (85, "highly likely"),
                                      (71, "highly likely"), (70, "likely"), (56, "likely"), (55, "even"),
                                      (46, "even"), (45, "unlikely"), (31, "unlikely"), (30, "highly unlikely"),
                                      (16, "highly unlikely"), (15, "remote"), (1, "remote")])
def test_credence_scale_boundaries(pct, word):
    from rootcause import credence
    assert credence.word(pct / 100) == word == expected_word(pct / 100)
    assert credence.word(credence.clamp(pct / 100)) == word


@pytest.mark.parametrize("x", [-1.0, 0.0, 0.004, 0.999, 1.0, 3.0])
def test_credence_clamp_stays_on_the_scale(x):
    from rootcause import credence
    c = credence.clamp(x)
    assert 0 <= c <= 1
    assert credence.word(c) == expected_word(c)


def test_credence_scale_is_one_file_copied_into_each_skill():
    # Issue 14: the scale is ml-debug's credence_scale.json; neither skill's code repeats it. Issue 26:
    # the root-cause skill ships an identical copy, so it runs without ml-debug beside it.
    from pathlib import Path

    import mldebug_common as mc
    from rootcause import credence
    ml_debug = Path(mc.__file__).with_name("credence_scale.json")
    assert credence.SCALE_FILE != ml_debug
    assert credence.SCALE_FILE.read_bytes() == ml_debug.read_bytes()
    doc = json.loads(credence.SCALE_FILE.read_text(encoding="utf-8"))["scale"]
    assert sorted((d["low"], d["word"]) for d in doc) == sorted(credence.scale())
    assert sorted((d["word"], d["low"], d["high"]) for d in doc) == sorted(mc.CREDENCE_SCALE)
    for module in (credence, mc):
        assert "highly unlikely" not in Path(module.__file__).read_text(encoding="utf-8"), module.__file__


# Expected first rule per synthetic case, from the category each fault should get (analysis_rules.md).
FIRST_RULE = {"corrupt": "parameters_differ", "corrupt_down": "parameters_differ", "permute": "parameters_differ",
              "no_act": "extra_op_between", "extra_op": "extra_op_between"}


@pytest.mark.parametrize("case", list(CASES))
def test_rules_fired_name_table_rows_and_give_the_confidence(analyze, case):
    """Every finding lists the rows of rootcause/rules.py that fired; its confidence is the first
    row's base score plus the adjustments listed after it."""
    from rootcause import rules
    rows = {r.id: r for r in rules.RULES + (rules.PROPAGATION, rules.PROPAGATION_EXAMPLE)}
    deltas = {a.id: a.delta for a in rules.ADJUSTMENTS}
    doc = analyze(**CASES[case]).doc
    for f in doc["root_causes"] + doc["other_candidates"]:
        fired = f["rules_fired"]
        assert fired[0] in rows, fired
        assert set(fired[1:]) <= set(deltas) | {rules.PROPAGATION.id}, fired
        assert rows[fired[0]].category == f["category"] or rules.PROPAGATION.id in fired
        expected = rows[fired[0]].base + sum(deltas.get(x, 0.0) for x in fired[1:])
        assert f["confidence"] == pytest.approx(min(0.99, max(0.01, expected)), abs=0.006), fired
    if case in FIRST_RULE:
        assert doc["root_causes"][0]["rules_fired"][0] == FIRST_RULE[case]
