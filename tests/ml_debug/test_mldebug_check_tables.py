"""check_tables: templates fail, filled examples pass, and each rule fires on its own."""
import pytest

from check_tables import TableChecker


def findings_for(text, name="reply.md"):
    return TableChecker(name, text).check()


def rules(text):
    return [f.rule for f in findings_for(text)]


@pytest.mark.parametrize("example", ["p1_reply.md", "p2_plan.md", "p3_report.md", "p4_stuck.md"])
def test_filled_examples_pass(skill, example):
    assert findings_for((skill.examples / example).read_text()) == []


@pytest.mark.parametrize("template, expected", [
    ("P1_run_finished.md", {"P1": 7, "P1 anomalies": 2, "P1 prediction check": 5}),
    ("P2_before_launch.md", {"P2": 6, "P2 metric confounds": 2}),
    ("P4_stuck.md", {"P4": 4}),
])
def test_unfilled_templates_report_every_empty_cell(skill, template, expected):
    found = findings_for((skill.assets / template).read_text(), template)
    assert {f.rule for f in found} == {"CELL-EMPTY"}
    for kind, count in expected.items():
        assert sum(f.message.startswith(f"{kind} row 1,") for f in found) == count
    assert all(f.message.endswith("empty cell") for f in found)


def test_unfilled_p3_template_names_the_empty_cells(skill):
    found = findings_for((skill.assets / "P3_before_reporting.md").read_text())
    assert {f.rule for f in found} == {"CELL-EMPTY"}
    assert any("P3 diagnoses row 4, column 'credence': empty cell" in f.message for f in found)
    assert any("P3 samples row 4, column 'complete output': empty cell" in f.message for f in found)


def test_unfilled_exercise_tables(skill):
    found = findings_for((skill.assets / "exercise_tables.md").read_text())
    kinds = {f.message.split(" row ")[0] for f in found}
    assert kinds == {"E1 evidence", "E2 bug hunt", "E3 diagnoses", "E5 review", "E6 reference", "E7 traces"}


P1 = """| risky part | expected | start | early | middle | end | quoted line |
|---|---|---|---|---|---|---|
| loss | falls | 2.3 (step 0) | 1.9 (step 100) | 1.2 (step 500) | 0.9 (step 1000) | `step=1000 loss=0.9` |
"""


@pytest.mark.parametrize("old, new, rule, fragment", [
    ("1.9 (step 100)", "", "CELL-EMPTY", "column 'early': empty cell"),
    ("1.9 (step 100)", "TBD", "CELL-EMPTY", "placeholder 'TBD'"),
    ("1.9 (step 100)", "unknown", "CELL-UNKNOWN", "must say what would fill it"),
    ("`step=1000 loss=0.9`", "step=1000 loss=0.9", "P1-QUOTE", "quote the log line"),
])
def test_p1_rules(old, new, rule, fragment):
    found = findings_for(P1.replace(old, new))
    assert [f.rule for f in found] == [rule]
    assert fragment in found[0].message
    assert found[0].line == 3


def test_p1_unknown_with_what_would_fill_it_passes():
    assert rules(P1.replace("1.9 (step 100)", "unknown: not logged before step 500; add it")) == []


def test_table_missing_columns_and_rows():
    four_col_p2 = ("| risky part | what I expect to see | what would falsify it | metric exists? |\n"
                   "|---|---|---|---|\n| lr | falls | rises | yes |\n")
    found = findings_for(four_col_p2)
    assert [f.rule for f in found] == ["TABLE-COLUMNS"]
    assert "too weak, too strong, buggy" in found[0].message
    assert rules(P1.splitlines()[0] + "\n" + P1.splitlines()[1] + "\n") == ["TABLE-NO-ROWS"]


def test_no_recognised_table():
    assert rules("# notes\n\n| a | b |\n|---|---|\n| 1 | 2 |\n") == ["NO-TABLES"]


P2 = """| risky part | what I expect to see | too weak | too strong | buggy | metric exists? |
|---|---|---|---|---|---|
| clip 5.0 | fires rarely | fires always | spike returns | counter stays 0 | no: add a clip counter |
"""


@pytest.mark.parametrize("new, rule", [
    ("maybe", "P2-METRIC-EXISTS"),
    ("no", "P2-METRIC-MISSING"),
])
def test_p2_metric_exists(new, rule):
    assert rules(P2.replace("no: add a clip counter", new)) == [rule]


def test_p2_unknown_signature_allowed_with_reason():
    assert rules(P2.replace("fires always", "unknown: this run cannot attribute it")) == []


PRED = """| prediction | observation | verdict | prior | posterior |
|---|---|---|---|---|
| loss below 2 | 1.9 | supported | likely, 60% | highly likely, 80% |
"""


@pytest.mark.parametrize("old, new, rule, fragment", [
    ("supported", "confirmed", "PRED-VERDICT", "supported, contradicted or unresolved"),
    ("likely, 60%", "likely, 90%", "CREDENCE", "'likely' means 56-70%"),
    ("highly likely, 80%", "80%", "CREDENCE", "number but no word"),
    ("highly likely, 80%", "highly likely", "CREDENCE", "word but no number"),
])
def test_prediction_check_rules(old, new, rule, fragment):
    found = findings_for(PRED.replace(old, new))
    assert [f.rule for f in found] == [rule]
    assert fragment in found[0].message


def test_anomaly_status():
    table = "| anomaly | status |\n|---|---|\n| spike at 1400 | explained: bad batch |\n"
    assert rules(table) == []
    assert rules(table.replace("explained: bad batch", "probably fine")) == ["P1-ANOMALY-STATUS"]


def test_credence_in_prose_must_match_its_word():
    assert rules(P1 + "\nI think this is likely (95%).\n") == ["CREDENCE"]


def p3(skill):
    return (skill.examples / "p3_report.md").read_text()


def test_p3_rule_diagnoses_count(skill):
    text = p3(skill)
    lines = [ln for ln in text.splitlines() if not ln.startswith("| code bug") and
             not ln.startswith("| the eval is invalid")]
    assert rules("\n".join(lines)) == ["P3-DIAGNOSES-COUNT"]


def test_p3_rule_unknown_cause(skill):
    text = p3(skill).replace("| unknown cause, not listed above |", "| tokenizer drift |")
    assert rules(text) == ["P3-UNKNOWN-CAUSE"]


def test_p3_rule_untested(skill):
    text = p3(skill).replace("not tested: no rescoring with exact match yet", "nothing")
    assert rules(text) == ["P3-UNTESTED"]


def test_p3_rule_invalid_count(skill):
    text = p3(skill).replace("| the seeds changed data order only in one arm | log the first batch ids "
                             "of each arm for seed 0 |\n", "")
    found = findings_for(text)
    assert [f.rule for f in found] == ["P3-INVALID-COUNT"]
    assert "4 row(s); write exactly five" in found[0].message


def test_p3_rule_samples(skill):
    text = p3(skill).replace("| worst | lowest score", "| second best | lowest score")
    found = findings_for(text)
    assert [f.rule for f in found] == ["P3-SAMPLES"]
    assert "lack: worst" in found[0].message


def test_p3_rule_one_seed(skill):
    text = p3(skill).replace("| 6 | +0.035", "| 1 | +0.035")
    assert rules(text) == ["P3-ONE-SEED"]
    assert rules(text.replace("LoRA higher; sign-flip", "unresolved; sign-flip")) == []


def test_p3_rule_missing_list(skill):
    text = p3(skill)
    start = text.index("**3. Five")
    end = text.index("**4. Complete")
    assert rules(text[:start] + text[end:]) == ["P3-MISSING-LIST"]


def test_p3_rule_diagnosis_credence(skill):
    text = p3(skill).replace("| likely, 60% |", "| very likely |")
    assert rules(text) == ["CREDENCE"]


P4 = """| feature | theirs (file:line) | mine | same? |
|---|---|---|---|
| lr | `ref/config.py:18` 2e-4 | 3e-4 | no |
"""


def test_p4_rules():
    assert rules(P4) == []
    assert rules(P4.replace("`ref/config.py:18` 2e-4", "2e-4 in their config")) == ["P4-FILE-LINE"]
    assert rules(P4.replace("| no |", "| different |")) == ["P4-SAME"]
    no_ref = "No reference exists for this loss.\n\n" + P4.replace("`ref/config.py:18` 2e-4", "their default")
    assert rules(no_ref) == []


P1_HEADER = ("| risky part | expected | start | early | middle | end | quoted line |\n"
             "|---|---|---|---|---|---|---|\n")


@pytest.mark.parametrize("placeholder", ["n/a", "N/A", "none", "xx", "?", "(blank)", "...", "-", "tbd", "NA"])
def test_placeholders_are_empty_cells(placeholder):
    row = f"| reward | rises | 0.2 (step 1) | {placeholder} | 0.4 (step 100) | 0.5 (step 200) | `reward=0.5` |\n"
    found = TableChecker("r.md", P1_HEADER + row).check()
    assert [(f.rule, f"placeholder '{placeholder}' left in cell" in f.message) for f in found] == [("CELL-EMPTY", True)]


@pytest.mark.parametrize("cells, ok", [
    ("unknown: no eval before step 50; add one at step 0 | unknown: same | unknown: same as the start column", True),
    ("unknown: no eval before step 50; add one at step 0 | unknown: ditto | unknown: as above", True),
    ("0.2 (step 1) | unknown: same | 0.4 (step 100)", False),
    ("unknown: no eval before step 50; add one at step 0 | 0.3 (step 20) | unknown: same as the early column", False),
])
def test_a_row_may_refer_back_to_an_unknown_it_already_explained(cells, ok):
    row = f"| eval accuracy | rises | {cells} | 0.5 (step 200) | `eval_accuracy=0.5` |\n"
    found = [f.rule for f in TableChecker("r.md", P1_HEADER + row).check()]
    assert found == ([] if ok else ["CELL-UNKNOWN"])


def test_p1_quoted_line_may_be_an_unknown_that_names_the_metric_to_log():
    row = ("| format reward | above 0.9 | unknown: not logged; log rewards/format from job 8 | unknown: same "
           "| unknown: same | unknown: same | unknown: not logged yet; add it in job 8 |\n")
    assert TableChecker("r.md", P1_HEADER + row).check() == []
