"""paired_compare: raw paired differences, bootstrap, sign count, spread, and unresolved verdicts."""
import argparse
import json

import numpy as np
import pytest

from mldebug_common import InputError
from paired_compare import bootstrap_interval, compare, sign_flip_p


def args(**kw):
    base = dict(metric=None, a=None, b=None, arm_key="arm", pair_key="seed", min_seeds=3,
                bootstrap=2000, level=0.95, seed=0)
    base.update(kw)
    return argparse.Namespace(**base)


def csv_file(tmp_path, rows, header="arm,seed,acc", name="r.csv"):
    path = tmp_path / name
    path.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return str(path)


def paired(diffs, base=0.5):
    rows = []
    for seed, d in enumerate(diffs):
        rows += [("base", seed, base + 0.01 * seed), ("new", seed, base + 0.01 * seed + d)]
    return rows


def test_resolved_when_every_seed_agrees(tmp_path):
    path = csv_file(tmp_path, paired([0.03, 0.04, 0.05, 0.035, 0.045, 0.04]))
    findings, result, text, _ = compare(path, args(a="new", b="base"))
    assert findings == []
    assert result["verdict"] == "new higher"
    assert result["mean_diff"] == pytest.approx(0.04)
    assert result["sign_count"] == {"a_higher": 6, "b_higher": 0, "ties": 0}
    assert result["sign_flip_p"] == pytest.approx(2 / 64)
    assert result["interval"][0] > 0
    assert "spread between seeds" in text


def test_differences_are_raw_units_not_z_scores(tmp_path):
    path = csv_file(tmp_path, paired([2.0, 4.0, 6.0], base=100))
    _, result, _, _ = compare(path, args(a="new", b="base"))
    assert result["pairs"] == {"0": 2.0, "1": 4.0, "2": 6.0}


def test_too_few_seeds_is_unresolved(tmp_path):
    path = csv_file(tmp_path, paired([0.05]))
    findings, result, text, _ = compare(path, args())
    assert result["verdict"] == "unresolved"
    assert [f.rule for f in findings] == ["UNRESOLVED"]
    assert "too few" in findings[0].message


def test_interval_spanning_zero_is_unresolved(tmp_path):
    path = csv_file(tmp_path, paired([0.05, -0.04, 0.03, -0.05, 0.02, -0.01]))
    findings, result, _, _ = compare(path, args())
    assert result["verdict"] == "unresolved"
    assert "spans zero" in findings[0].message


def test_unanimous_but_few_seeds_is_unresolved_by_the_sign_flip_test(tmp_path):
    path = csv_file(tmp_path, paired([0.03, 0.04, 0.05, 0.04]))
    findings, result, _, _ = compare(path, args())
    assert result["interval"][0] > 0 or result["interval"][1] < 0
    assert result["verdict"] == "unresolved"
    assert "sign-flip p = 0.125" in findings[0].message


def test_unpaired_and_nonfinite_rows_are_reported_not_dropped(tmp_path):
    rows = paired([0.03, 0.04, 0.05, 0.03, 0.04, 0.05]) + [("new", 9, 0.7), ("base", 10, "nan")]
    findings, result, _, _ = compare(csv_file(tmp_path, rows), args())
    assert sorted(f.rule for f in findings) == ["NONFINITE", "UNPAIRED", "UNPAIRED"]
    assert result["n_pairs"] == 6


def test_default_metric_is_last_numeric_column(tmp_path):
    rows = [(a, s, 0.5 + s / 100, f"run{s}") for a in ("x", "y") for s in range(3)]
    path = csv_file(tmp_path, rows, header="arm,seed,acc,name")
    _, result, _, _ = compare(path, args())
    assert result["metric"] == "acc"


def test_jsonl_input_and_named_arms(tmp_path):
    path = tmp_path / "r.jsonl"
    rows = [{"arm": arm, "seed": s, "loss": 1.0 + (0.1 if arm == "b" else 0) + s / 50}
            for arm in ("a", "b", "c") for s in range(6)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    _, result, _, _ = compare(str(path), args(a="b", b="a"))
    assert result["mean_diff"] == pytest.approx(0.1)
    with pytest.raises(InputError, match="3 arm"):
        compare(str(path), args())


@pytest.mark.parametrize("rows, header, message", [
    ([("a", 0, 1), ("a", 0, 2), ("b", 0, 1)], "arm,seed,acc", "two rows for seed '0'"),
    ([("a", 0, 1)], "group,seed,acc", "no 'arm' column"),
])
def test_bad_input(tmp_path, rows, header, message):
    with pytest.raises(InputError, match=message):
        compare(csv_file(tmp_path, rows, header=header), args())


def test_bootstrap_is_deterministic_and_sign_flip_exact():
    diffs = np.array([0.1, 0.2, 0.3])
    assert bootstrap_interval(diffs, 0.95, 500, 0) == bootstrap_interval(diffs, 0.95, 500, 0)
    assert sign_flip_p(diffs, 0) == pytest.approx(2 / 8)
    assert sign_flip_p(np.array([0.1, -0.1]), 0) == 1.0


def test_unresolved_says_how_many_seeds_would_resolve_it(cli, write):
    # Five seeds that all agree, a gap several times the seed spread: only the sign-flip floor is missing.
    rows = ["arm,seed,acc"] + [f"{arm},{s},{0.6 + (0.057 + 0.004 * (s % 3) if arm == 'b' else 0.01 * (s % 2))}"
                               for s in range(5) for arm in ("a", "b")]
    res = cli("paired_compare", write("r.csv", "\n".join(rows)), "--a", "b", "--b", "a", "--json")
    comp = res.json["comparisons"][0]
    assert comp["verdict"] == "unresolved" and comp["pairs_to_resolve"] == 6
    assert "about 6 pairs (1 more) would resolve it" in res.json["findings"][0]["message"]


def test_pairs_to_resolve_grows_with_the_spread():
    import numpy as np
    from paired_compare import seeds_to_resolve
    tight, _ = seeds_to_resolve(np.array([0.05, 0.06, 0.055, 0.05]), 0.95)
    noisy, why = seeds_to_resolve(np.array([0.05, -0.04, 0.09, -0.02]), 0.95)
    assert tight == 6 and noisy > 20 and "for 80% power" in why
    assert seeds_to_resolve(np.array([0.1]), 0.95)[0] is None
