"""sample_outputs, check_overfit and check_quotes: selection rules, the near-zero judgement, quotes."""
import argparse
import json

import pytest

from check_overfit import check as check_overfit
from check_quotes import extract_quotes, found
from mldebug_common import InputError
from sample_outputs import sample


def sample_args(**kw):
    base = dict(score_key=None, text_key=None, input_key=None, id_key=None, group_key=None, k=1, seed=0)
    base.update(kw)
    return argparse.Namespace(**base)


def eval_file(tmp_path, rows, name="eval.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def normal_rows(n=12):
    return [{"id": f"q{i}", "prompt": f"question {i}", "output": f"answer number {i} is short",
             "score": i / n} for i in range(n)]


def test_best_worst_random_and_rule_text(tmp_path):
    findings, result, text, _ = sample(eval_file(tmp_path, normal_rows()), sample_args())
    picks = result["picks"]["all"]
    assert findings == [] and picks["anomalous"] == []
    assert picks["best"] == [12] and picks["worst"] == [1]
    assert "sampling rule: random = the 1 row(s) with the smallest sha256('0:<id>')" in text
    assert '"output": "answer number 11 is short"' in text


def test_random_pick_is_stable_under_reordering_and_changes_with_seed(tmp_path):
    rows = normal_rows(30)
    _, r1, _, _ = sample(eval_file(tmp_path, rows, "a.jsonl"), sample_args())
    _, r2, _, _ = sample(eval_file(tmp_path, rows[::-1], "b.jsonl"), sample_args())
    first = r1["records"][str(r1["picks"]["all"]["random"][0])]["id"]
    second = r2["records"][str(r2["picks"]["all"]["random"][0])]["id"]
    assert first == second
    ids = {r["id"] for seed in range(8)
           for r in [sample(eval_file(tmp_path, rows, "a.jsonl"), sample_args(seed=seed))[1]]
           for r in [r["records"][str(r["picks"]["all"]["random"][0])]]}
    assert len(ids) > 1


@pytest.mark.parametrize("change, reason", [
    ({"score": float("nan")}, "not finite"),
    ({"output": "   "}, "empty output"),
    ({"output": "question 3"}, "copies its input"),
    ({"output": "I'm sorry, I cannot help with that."}, "refusal"),
    ({"output": "the same words again " * 6}, "repeats"),
    ({"output": "x" * 5000}, "unusually long"),
    ({"output": "answer number 4 is short"}, "same output as rows with 1 other input"),
])
def test_each_anomaly_rule(tmp_path, change, reason):
    rows = normal_rows()
    rows[3].update(change)
    findings, result, _, _ = sample(eval_file(tmp_path, rows), sample_args())
    assert 4 in result["picks"]["all"]["anomalous"]
    assert any(reason in f.message and f.line == 4 and f.rule == "ANOMALOUS" for f in findings)


def test_groups_get_their_own_picks(skill):
    findings, result, text, _ = sample(str(skill.examples / "eval.jsonl"), sample_args(group_key="arm"))
    assert set(result["picks"]) == {"base", "lora"}
    assert result["picks"]["lora"]["worst"] == [10]
    assert {f.line for f in findings} == {9, 10}
    assert "== random (base): line" in text


def test_missing_score_key_is_bad_input(tmp_path):
    with pytest.raises(InputError, match="no score key"):
        sample(eval_file(tmp_path, [{"output": "a"}]), sample_args())
    with pytest.raises(InputError, match="score key 'grade' not found"):
        sample(eval_file(tmp_path, normal_rows()), sample_args(score_key="grade"))


def overfit_args(**kw):
    base = dict(metric=None, step_key=None, format=None, target=0.05, relative=None, num_classes=None,
                pretrained=False)
    base.update(kw)
    return argparse.Namespace(**base)


def loss_log(tmp_path, values, key="loss"):
    path = tmp_path / "overfit.jsonl"
    path.write_text("\n".join(json.dumps({"step": i * 10, key: v}) for i, v in enumerate(values)))
    return str(path)


def test_overfit_near_zero_passes_with_the_number(tmp_path):
    findings, summary, text, _ = check_overfit(loss_log(tmp_path, [2.3, 0.9, 0.1, 0.004]), overfit_args())
    assert findings == [] and summary["near_zero"] and summary["final"] == 0.004
    assert "2.3 (step 0) -> 0.004 (step 30)" in text and "near zero: yes" in text


def test_overfit_not_near_zero(tmp_path):
    findings, summary, _, _ = check_overfit(loss_log(tmp_path, [2.3, 1.4, 1.1, 0.9]), overfit_args())
    assert [f.rule for f in findings] == ["OVERFIT-NOT-ZERO"]
    assert "final loss 0.9 is above target 0.05" in findings[0].message


def test_overfit_came_back_up_and_nonfinite(tmp_path):
    findings, _, _, _ = check_overfit(loss_log(tmp_path, [2.3, 0.01, 0.3]), overfit_args())
    assert "came back up" in findings[0].message
    findings, _, _, _ = check_overfit(loss_log(tmp_path, [2.3, 0.01, float("nan")]), overfit_args())
    assert "is not finite" in findings[0].message


def test_overfit_relative_threshold_and_metric_choice(tmp_path):
    path = loss_log(tmp_path, [40.0, 5.0, 0.3], key="train_loss")
    assert check_overfit(path, overfit_args())[0] != []
    findings, summary, _, _ = check_overfit(path, overfit_args(relative=0.01))
    assert findings == [] and summary["metric"] == "train_loss" and summary["threshold"] == 0.4


def test_overfit_initial_loss_against_chance(tmp_path):
    findings, _, _, _ = check_overfit(loss_log(tmp_path, [0.2, 0.01, 0.001]), overfit_args(num_classes=10))
    assert [f.rule for f in findings] == ["OVERFIT-INIT"]
    findings, _, _, _ = check_overfit(loss_log(tmp_path, [2.31, 0.01, 0.001]), overfit_args(num_classes=10))
    assert findings == []


def test_overfit_without_loss_column(tmp_path):
    with pytest.raises(InputError, match="no training loss column"):
        check_overfit(loss_log(tmp_path, [1.0, 0.5], key="acc"), overfit_args())


REPORT = """The log has 3 lines.

| risky part | expected | start | early | middle | end | quoted line |
|---|---|---|---|---|---|---|
| loss | falls | 2 | 1 | 1 | 0.5 | `step=2 loss=0.5` |

log: `WARNING clip`

```log
step=1 loss=1.0
```
"""
LOG = "step=1 loss=1.0\n\x1b[33mWARNING clip\x1b[0m fired\nstep=2 loss=0.5 lr=1e-4\n"


def test_quotes_extracted_from_table_intro_line_and_log_fence():
    quotes = [q for _, q in extract_quotes(REPORT)]
    assert quotes == ["step=2 loss=0.5", "WARNING clip", "step=1 loss=1.0"]


def test_quote_matching_rules():
    lines = ["step=2 loss=0.5 lr=1e-4", "epoch 3 |####| 50% eta 3s"]
    assert found("loss=0.5", lines)
    assert found("step=2 ... lr=1e-4", lines)
    assert found("epoch 3 \u2026 eta 3s", lines)
    assert not found("step=2 loss=0.6", lines)
    assert not found("lr=1e-4 ... step=2", lines)


def test_check_quotes_cli_finds_missing_and_length(cli, write):
    report = write("r.md", REPORT)
    log = write("run.log", LOG)
    ok = cli("check_quotes", report, log, "--json")
    assert ok.code == 0 and ok.json["ok"] and all(q["found"] for q in ok.json["quotes"])
    bad = write("bad.md", REPORT.replace("loss=0.5`", "loss=0.4`").replace("3 lines", "30 lines"))
    res = cli("check_quotes", bad, log)
    assert res.code == 1
    assert "CQ-NOT-FOUND: quote not in" in res.out and "CQ-LENGTH: report says 30 lines" in res.out
    none = write("none.md", "Looks fine to me.\n")
    assert "CQ-NONE" in cli("check_quotes", none, log).out


def test_classifier_labels_are_not_duplicate_outputs(cli, write):
    rows = [{"id": i, "input": f"ticket {i}", "output": ("billing", "login", "refund")[i % 3],
             "score": i % 2} for i in range(12)]
    res = cli("sample_outputs", write("labels.jsonl", "\n".join(json.dumps(r) for r in rows)), "--json")
    assert res.code == 0, res.out
    assert res.json["samples"][0]["label_counts"] == {"billing": 4, "login": 4, "refund": 4}
    assert "outputs are class labels" in res.json["samples"][0]["rule"]
    rows[5]["output"] = ""
    res = cli("sample_outputs", write("labels.jsonl", "\n".join(json.dumps(r) for r in rows)), "--json")
    assert [(f["line"], f["message"]) for f in res.json["findings"]] == [(6, "empty output")]


def test_free_text_repeats_are_still_duplicates(cli, write):
    rows = [{"id": i, "input": f"question {i}", "output": "I think the answer is probably seven", "score": 0}
            for i in range(6)]
    res = cli("sample_outputs", write("free.jsonl", "\n".join(json.dumps(r) for r in rows)), "--json")
    assert res.code == 1 and "same output as rows with 5 other input(s)" in res.json["findings"][0]["message"]


def test_overfit_grades_the_training_loss_and_names_it(cli, write):
    rows = [{"step": 0, "eval_loss": 2.5}] + [{"step": s, "loss": 2.3 * 0.5 ** s} for s in range(10)] \
        + [{"step": 9, "eval_loss": 2.9}]
    res = cli("check_overfit", write("o.jsonl", "\n".join(json.dumps(r) for r in rows)), "--json")
    run = res.json["runs"][0]
    assert res.code == 0 and run["metric"] == "loss" and run["not_graded"] == ["eval_loss"]
    assert "graded column: loss (not graded: eval_loss)" in cli("check_overfit", write("o2.jsonl", "\n".join(
        json.dumps(r) for r in rows))).out


def test_overfit_pretrained_lm_start_is_not_leakage(cli, write):
    path = write("lm.jsonl", "\n".join(json.dumps({"step": s, "loss": 2.3 * 0.4 ** s}) for s in range(8)))
    random_init = cli("check_overfit", path, "--num-classes", "151936")
    assert random_init.code == 1 and "unless the model is pretrained" in random_init.out
    pretrained = cli("check_overfit", path, "--num-classes", "151936", "--pretrained")
    assert pretrained.code == 0 and "vs ln(151936) = 11.93, the uniform-guess loss; a pretrained" in pretrained.out
    worse = write("worse.jsonl", "\n".join(json.dumps({"step": s, "loss": 30 * 0.01 ** s}) for s in range(3)))
    assert "OVERFIT-INIT" in cli("check_overfit", worse, "--num-classes", "151936", "--pretrained").out
