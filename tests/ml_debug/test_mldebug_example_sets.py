"""Every checker on the GRPO and SFT example sets: nothing in good/, exactly the broken rule in broken/.

The sets live in ml-debug/examples/{grpo,sft}; examples/README.md lists each broken file and its rule.
"""
import re

import pytest

EXAMPLES = ("grpo", "sft")

# (checker, files relative to the set, extra arguments)
GOOD_RUNS = {
    "grpo": [
        ("check_training_guide", ["good/TRAINING_GUIDE.md"], []),
        ("check_evidence_criteria", ["good/AGENTS.md"], []),
        ("check_tables", ["good/p1_reply.md"], []),
        ("check_quotes", ["good/p1_reply.md", "good/metrics.log"], []),
        ("read_curves", ["good/metrics.log"], []),
        ("scan_silent_bugs", ["good/train_grpo.py"], []),
    ],
    "sft": [
        ("check_training_guide", ["good/TRAINING_GUIDE.md"], []),
        ("check_evidence_criteria", ["good/AGENTS.md"], []),
        ("check_tables", ["good/p1_reply.md"], []),
        ("check_quotes", ["good/p1_reply.md", "good/train.log"], []),
        ("read_curves", ["good/train.log"], []),
        ("scan_silent_bugs", ["good/train_sft.py"], []),
        ("check_overfit", ["good/overfit_20.jsonl"], ["--num-classes", "151936", "--pretrained"]),
        ("paired_compare", ["good/results.csv"], ["--a", "sft", "--b", "base"]),
        ("sample_outputs", ["good/eval.jsonl"], ["--group-key", "arm"]),
    ],
}
BROKEN_RUNS = {
    "grpo": [
        ("check_training_guide", ["broken/TRAINING_GUIDE_things_that_could_go_wrong.md"], [], "TG-FAILURE-LIST"),
        ("check_evidence_criteria", ["broken/AGENTS_exposed_by_a_metric.md"], [], "EC-PERVERSE-EXPOSE"),
        ("check_tables", ["broken/p1_reply_na_cell.md"], [], "CELL-EMPTY"),
        ("check_quotes", ["broken/p1_reply_misquoted.md", "good/metrics.log"], [], "CQ-NOT-FOUND"),
        ("read_curves", ["broken/metrics_kl_blowup.log"], [], "DIVERGE"),
        ("scan_silent_bugs", ["broken/train_grpo_ratio_detached.py"], [], "SB-DETACH"),
    ],
    "sft": [
        ("check_training_guide", ["broken/TRAINING_GUIDE_suspects.md"], [], "TG-FAILURE-LIST"),
        ("check_evidence_criteria", ["broken/AGENTS_undefined_arm.md"], [], "EC-PERVERSE-EXPOSE"),
        ("check_tables", ["broken/p1_reply_unknown_same.md"], [], "CELL-UNKNOWN"),
        ("read_curves", ["broken/train_diverged.log"], [], "DIVERGE"),
        ("scan_silent_bugs", ["broken/train_sft_softmax_ce.py"], [], "SB-SOFTMAX-CE"),
        ("check_overfit", ["broken/overfit_stuck.jsonl"], ["--num-classes", "151936", "--pretrained"],
         "OVERFIT-NOT-ZERO"),
        ("paired_compare", ["broken/results_five_seeds.csv"], ["--a", "sft", "--b", "base"], "UNRESOLVED"),
        ("sample_outputs", ["broken/eval_empty_output.jsonl"], ["--group-key", "arm"], "ANOMALOUS"),
    ],
}


def ids(runs):
    return [f"{s}:{r[0]}:{r[1][0]}" for s in EXAMPLES for r in runs[s]]


@pytest.mark.parametrize("example, run", [(s, r) for s in EXAMPLES for r in GOOD_RUNS[s]], ids=ids(GOOD_RUNS))
def test_good_version_raises_nothing(cli, skill, example, run):
    checker, files, extra = run
    res = cli(checker, *[skill.examples / example / f for f in files], *extra, "--json")
    assert res.code == 0, res.out + res.err
    assert res.json["findings"] == []


@pytest.mark.parametrize("example, run", [(s, r) for s in EXAMPLES for r in BROKEN_RUNS[s]],
                         ids=ids(BROKEN_RUNS))
def test_broken_version_is_flagged_for_its_rule_only(cli, skill, example, run):
    checker, files, extra, rule = run
    res = cli(checker, *[skill.examples / example / f for f in files], *extra, "--json")
    assert res.code == 1, res.out + res.err
    assert {f["rule"] for f in res.json["findings"]} == {rule}
    assert all(f["file"].endswith(files[0]) for f in res.json["findings"])


def test_each_broken_file_differs_from_its_good_version_in_one_place(skill):
    # A broken version is a copy of a good file with one edit, so the checker has nothing else to find.
    pairs = {"grpo": {"TRAINING_GUIDE_things_that_could_go_wrong.md": "TRAINING_GUIDE.md",
                      "AGENTS_exposed_by_a_metric.md": "AGENTS.md", "p1_reply_na_cell.md": "p1_reply.md",
                      "p1_reply_misquoted.md": "p1_reply.md", "train_grpo_ratio_detached.py": "train_grpo.py"},
             "sft": {"TRAINING_GUIDE_suspects.md": "TRAINING_GUIDE.md", "AGENTS_undefined_arm.md": "AGENTS.md",
                     "p1_reply_unknown_same.md": "p1_reply.md", "train_sft_softmax_ce.py": "train_sft.py",
                     "eval_empty_output.jsonl": "eval.jsonl"}}
    import difflib
    for example, mapping in pairs.items():
        for broken, good in mapping.items():
            a = (skill.examples / example / "good" / good).read_text().splitlines()
            b = (skill.examples / example / "broken" / broken).read_text().splitlines()
            changed = [op for op in difflib.SequenceMatcher(None, a, b).get_opcodes() if op[0] != "equal"]
            assert len(changed) == 1, (example, broken, changed)


def test_readme_lists_every_broken_file_with_its_rule(skill):
    readme = (skill.examples / "README.md").read_text()
    for example in EXAMPLES:
        for checker, files, _, rule in BROKEN_RUNS[example]:
            name = files[0].split("/")[1]
            assert re.search(rf"\| `{re.escape(name)}` \| {checker}\b.*\| {rule} \|", readme), name
        listed = {f.name for f in (skill.examples / example / "broken").iterdir()}
        assert listed == {r[1][0].split("/")[1] for r in BROKEN_RUNS[example]}


def test_example_logs_are_realistic_mixtures(skill):
    # About 200 steps of records mixed with warnings, progress bars and key=value lines.
    from metric_logs import load_metric_log
    for path in (skill.examples / "grpo/good/metrics.log", skill.examples / "sft/good/train.log"):
        log = load_metric_log(str(path))
        text = path.read_text()
        assert log.skipped >= 5 and "WARNING" in text and "s/it]" in text
        assert 195 <= len(log.series("loss", log.step_key())) <= 205
