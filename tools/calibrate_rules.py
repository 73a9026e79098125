"""Count, for each set of fired triage rules, how many findings the real corpus gives and how many
are right (a developer tool; issue 14 item 2).

Runs the root-cause command on every tests/data/real/<case> as a user runs it, and on the
synthetic pairs listed in SYNTHETIC (tests/synth), and compares each report with the expected
answer: the top root cause of a faulty case is one finding, right when
it names the expected category, side and modules; every root cause of a clean case is a wrong
finding. Writes

    rl-consistency-analysis/scripts/rootcause/calibration.json   read by rootcause/credence.py
    rl-consistency-analysis/references/calibration.md           the same table, for readers

The corpus holds planted faults of a few kinds on small models: the counts bound, they do not
prove, how often a rule is right on users' dumps.

    python tools/calibrate_rules.py
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "rl-consistency-analysis" / "scripts"))
from real.corpus_check import CORPUS, case_doc, default_expected, disagreements, run_default_command, run_pair  # noqa: E402
from rootcause.credence import bin_key  # noqa: E402
from synth import Config, generate_pair  # noqa: E402
from synth import faults as F  # noqa: E402

PARAM, IMPL, OP = "parameter_or_checkpoint_issue", "in_module_impl_difference", \
    "missing_or_extra_op_between_aligned_boundary"
# Synthetic pairs (tests/synth, HF train vs vLLM rollout, 4 layers): label -> (faults, mode,
# expected (category, layer, side) with None where the tests do not fix it, or None for clean).
SYNTHETIC = {
    "clean_statistics": ((), "statistics", None),
    "clean_tensor": ((), "tensor", None),
    "corrupt_rollout_gate_1": ((F.CorruptWeight("rollout", "gate", 1),), "statistics", (PARAM, 1, None)),
    "corrupt_train_down_0": ((F.CorruptWeight("train", "down", 0),), "statistics", (PARAM, 0, None)),
    "corrupt_rollout_o_2": ((F.CorruptWeight("rollout", "o", 2),), "statistics", (PARAM, 2, None)),
    "corrupt_train_up_3_tensor": ((F.CorruptWeight("train", "up", 3),), "tensor", (PARAM, 3, None)),
    "permute_qkv_rollout_1": ((F.PermuteQKV("rollout", 1),), "statistics", (PARAM, 1, "rollout")),
    "norm_eps_train_3": ((F.NormEps("train", 1e-2, layer=3),), "statistics", (IMPL, 3, None)),
    "rope_theta_rollout": ((F.RopeTheta("rollout", 500.0),), "statistics", (IMPL, 0, None)),
    "activation_rollout": ((F.Activation("rollout", "gelu_tanh"),), "statistics", (IMPL, 0, None)),
    "no_act_train_1": ((F.MissingActivation("train", 1),), "statistics", (OP, 1, "rollout")),
    "no_act_train_0_tensor": ((F.MissingActivation("train", 0),), "tensor", (OP, 0, "rollout")),
    "extra_op_rollout_2": ((F.ExtraOp("rollout", 2),), "statistics", (OP, 2, "rollout")),
    "bf16_lm_head_rollout": ((F.HalfPrecision("rollout", "lm_head"),), "statistics", (IMPL, None, "rollout")),
    "lm_head_far_off_rollout": ((F.CorruptWeight("rollout", "lm_head", scale=3.0),), "statistics", (PARAM, None, None)),
}

OUT_JSON = REPO / "rl-consistency-analysis" / "scripts" / "rootcause" / "calibration.json"
OUT_MD = REPO / "rl-consistency-analysis" / "references" / "calibration.md"
MIN_FINDINGS = 20


def tally(reports: dict) -> tuple[Counter, Counter, list[str], list[tuple]]:
    """(findings per bin, right findings per bin, cases with no report, per-case matrix rows)."""
    seen, right, failed, matrix = Counter(), Counter(), [], []
    for name, (code, err, doc) in sorted(reports.items()):
        if doc is None:
            failed.append(name)
            continue
        expected = default_expected(case_doc(name))
        causes = doc.get("root_causes") or []
        ok = not disagreements(expected, code, err, doc)
        fired = [bin_key(f["rules_fired"]) for f in (causes if expected["verdict"] == "clean" else causes[:1])]
        for k in fired:
            seen[k] += 1
            right[k] += ok and expected["verdict"] != "clean"
        matrix.append((name, expected.get("category") or expected["verdict"], ", ".join(fired) or "-", ok))
    return seen, right, failed, matrix


def synthetic(root: Path) -> dict:
    """label -> (expected, output_5 document or None) for every SYNTHETIC pair."""
    out = {}
    for label, (faults, mode, expected) in SYNTHETIC.items():
        train, rollout = generate_pair(root / label / "pair", Config(layers=4, hidden=32), faults=faults, task=mode)
        code, err, doc = run_pair(train, rollout, root / label / "out")
        out[label] = (expected, doc)
    return out


def tally_synthetic(results: dict, seen: Counter, right: Counter, failed: list, matrix: list) -> None:
    """Add the synthetic findings: right when category, layer and side (where given) agree."""
    for label, (expected, doc) in results.items():
        if doc is None:
            failed.append(label)
            continue
        causes = doc.get("root_causes") or []
        if expected is None:
            fired = [bin_key(f["rules_fired"]) for f in causes]
            ok = not causes
        else:
            fired = [bin_key(causes[0]["rules_fired"])] if causes else []
            cat, layer, side = expected
            ok = bool(causes) and causes[0]["category"] == cat and causes[0].get("layer") == layer \
                and (side is None or causes[0].get("side") == side)
        for k in fired:
            seen[k] += 1
            right[k] += ok and expected is not None
        matrix.append((f"synthetic {label}", expected[0] if expected else "clean", ", ".join(fired) or "-", ok))


def markdown(seen: Counter, right: Counter, cases: int, matrix: list[tuple]) -> str:
    cases_rows = "\n".join(f"| {n} | {e} | {f} | {'yes' if ok else 'no'} |" for n, e, f, ok in matrix)
    rows = "\n".join(f"| `{k}` | {seen[k]} | {right[k]} | {'yes' if seen[k] >= MIN_FINDINGS else 'no'} |"
                     for k in sorted(seen, key=lambda k: (-seen[k], k)))
    return f"""# Calibration of the triage rules

Written by `tools/calibrate_rules.py` from the real corpus (`tests/data/real`, {cases} cases) and
{len(SYNTHETIC)} synthetic pairs (`tests/synth`, HF vs vLLM, listed in the tool); do not edit by
hand. A bin is the set of rules a finding fired (`rules_fired`: the category row, then the
adjustments). A finding is the top root cause of a faulty case (right when category,
side and modules are the expected ones; for a synthetic pair category, layer and, where the tests
fix it, side) or any root cause of a clean case (always wrong).

output_5 gives a credence word (`confidence_word`) only for findings whose bin holds at least
{MIN_FINDINGS} findings here; elsewhere `confidence_word` is `"uncalibrated"` and only the number
`confidence` (from the rule table) is given. The corpus holds planted faults of a few kinds on small
models: these counts bound, they do not prove, how often a rule is right on users' dumps.

| rules fired | findings | right | word given |
|---|---|---|---|
{rows}

## Which rules fire on which pair
The top root cause of each faulty case, every root cause of a clean one; "right" is whether the
report agrees with the case's `expected` (for a clean case: reported nothing), or with its
`expected_without_model` where the fault shows only against the checkpoint's forward (these runs
pass no `--model`).

| case | expected | rules fired | right |
|---|---|---|---|
{cases_rows}
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="cases run at once (default 2)")
    args = ap.parse_args(argv)
    names = sorted(p.parent.name for p in CORPUS.glob("*/case.json"))
    with tempfile.TemporaryDirectory() as tmp:
        reports = run_default_command(names, tmp, workers=args.workers)
        synth = synthetic(Path(tmp) / "synthetic")
    seen, right, failed, matrix = tally(reports)
    tally_synthetic(synth, seen, right, failed, matrix)
    doc = {"schema_version": "1.0", "min_findings": MIN_FINDINGS, "corpora": ["tests/data/real", "tests/synth"],
           "cases": len(names) + len(SYNTHETIC),
           "bins": {k: {"findings": seen[k], "right": right[k]} for k in sorted(seen)}}
    OUT_JSON.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    OUT_MD.write_text(markdown(seen, right, len(names), matrix), encoding="utf-8")
    print(f"{len(names)} real and {len(SYNTHETIC)} synthetic cases, {sum(seen.values())} findings in {len(seen)} bins; no report: {failed or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
