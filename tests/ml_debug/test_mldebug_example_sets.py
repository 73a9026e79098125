"""Every checker on the example sets: nothing in good/, exactly the broken rule in broken/.

The sets live in ml-debug/examples/{grpo,sft,stacks}; examples/README.md lists each broken file and
its rule. `stacks` is the second set, written the way other stacks and authors write: real logs of
the Trainer, TRL, Lightning and accelerate (tools/make_mldebug_stack_logs.py), verl consoles and W&B
exports from their format strings (tools/make_mldebug_console_logs.py), terse and verbose documents.
"""
import re

import pytest

EXAMPLES = ("grpo", "sft", "stacks")
STACK_LOGS = ("trainer_clm.log", "trainer_cls.log", "dpo_beta01.log", "dpo_beta05.log", "accelerate_loop.log",
              "verl_ppo_console.log", "verl_grpo_console.log", "wandb_export_ppo.csv", "wandb_export_grpo.csv",
              "lightning_forecast_metrics.csv", "lightning_classify_metrics.csv")

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
    "stacks": [
        *[("read_curves", [f"good/{log}"], []) for log in STACK_LOGS],
        ("check_evidence_criteria", ["good/AGENTS_terse.md"], []),
        ("check_evidence_criteria", ["good/AGENTS_verbose.md"], []),
        ("check_training_guide", ["good/TRAINING_GUIDE_terse.md"], []),
        ("check_training_guide", ["good/TRAINING_GUIDE_verbose.md"], []),
        ("check_tables", ["good/p1_reply_verl.md"], []),
        ("check_tables", ["good/p1_reply_dpo.md"], []),
        ("check_quotes", ["good/p1_reply_verl.md", "good/verl_ppo_console.log"], []),
        ("check_quotes", ["good/p1_reply_dpo.md", "good/dpo_beta01.log"], []),
        *[("scan_silent_bugs", [f"good/{code}"], [])
          for code in ("train_hf_trainer.py", "train_accelerate.py", "ppo_loss.py", "train_forecast.py")],
        ("sample_outputs", ["good/eval_intent.jsonl"], []),
        ("sample_outputs", ["good/eval_sentiment.jsonl"], ["--group-key", "arm"]),
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
    "stacks": [
        ("read_curves", ["broken/verl_ppo_console_nan.log"], [], "NONFINITE"),
        ("read_curves", ["broken/dpo_beta01_loss_spike.log"], [], "SPIKE"),
        ("read_curves", ["broken/wandb_export_ppo_kl_blowup.csv"], [], "DIVERGE"),
        ("read_curves", ["broken/lightning_forecast_metrics_nan.csv"], [], "NONFINITE"),
        ("check_evidence_criteria", ["broken/AGENTS_terse_undefined_key.md"], [], "EC-PERVERSE-EXPOSE"),
        ("check_evidence_criteria", ["broken/AGENTS_verbose_no_metric.md"], [], "EC-METRIC"),
        ("check_training_guide", ["broken/TRAINING_GUIDE_terse_hedged_unknown.md"], [], "TG-UNKNOWN-CLAIM"),
        ("check_training_guide", ["broken/TRAINING_GUIDE_verbose_what_might_break.md"], [], "TG-FAILURE-LIST"),
        ("check_quotes", ["broken/p1_reply_verl_wrong_length.md", "good/verl_ppo_console.log"], [], "CQ-LENGTH"),
        ("check_tables", ["broken/p1_reply_dpo_bare_unknown.md"], [], "CELL-UNKNOWN"),
        ("scan_silent_bugs", ["broken/train_accelerate_eval_helper.py"], [], "SB-EVAL-NO-TRAIN"),
        ("scan_silent_bugs", ["broken/ppo_loss_ratio_detached.py"], [], "SB-DETACH"),
        ("scan_silent_bugs", ["broken/train_forecast_shuffled_split.py"], [], "SB-SHUFFLE-SPLIT"),
        ("sample_outputs", ["broken/eval_intent_one_class.jsonl"], [], "COLLAPSED"),
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
                     "eval_empty_output.jsonl": "eval.jsonl"},
             "stacks": {"verl_ppo_console_nan.log": "verl_ppo_console.log",
                        "dpo_beta01_loss_spike.log": "dpo_beta01.log",
                        "wandb_export_ppo_kl_blowup.csv": "wandb_export_ppo.csv",
                        "lightning_forecast_metrics_nan.csv": "lightning_forecast_metrics.csv",
                        "AGENTS_terse_undefined_key.md": "AGENTS_terse.md",
                        "AGENTS_verbose_no_metric.md": "AGENTS_verbose.md",
                        "TRAINING_GUIDE_terse_hedged_unknown.md": "TRAINING_GUIDE_terse.md",
                        "TRAINING_GUIDE_verbose_what_might_break.md": "TRAINING_GUIDE_verbose.md",
                        "p1_reply_verl_wrong_length.md": "p1_reply_verl.md",
                        "p1_reply_dpo_bare_unknown.md": "p1_reply_dpo.md",
                        "train_accelerate_eval_helper.py": "train_accelerate.py",
                        "ppo_loss_ratio_detached.py": "ppo_loss.py",
                        "train_forecast_shuffled_split.py": "train_forecast.py"}}
    import difflib
    for example, mapping in pairs.items():
        for broken, good in mapping.items():
            a = (skill.examples / example / "good" / good).read_text().split("\n")
            b = (skill.examples / example / "broken" / broken).read_text().split("\n")
            changed = [op for op in difflib.SequenceMatcher(None, a, b).get_opcodes() if op[0] != "equal"]
            assert len(changed) == 1, (example, broken, changed)


def test_collapsed_eval_differs_from_its_good_version_in_the_outputs_only(skill):
    # A collapse rewrites the output of every row that was not already the one class, and its score.
    import json
    good = [json.loads(ln) for ln in (skill.examples / "stacks/good/eval_intent.jsonl").read_text().splitlines()]
    bad = [json.loads(ln) for ln in (skill.examples / "stacks/broken/eval_intent_one_class.jsonl").read_text().splitlines()]
    assert len(good) == len(bad) and len({r["output"] for r in bad}) == 1
    assert all({k for k in g if g[k] != b[k]} <= {"output", "correct"} for g, b in zip(good, bad))


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


def test_second_set_has_two_good_documents_of_each_kind(skill):
    # Other stacks and authors: two or more of every log format, document kind, code idiom and eval file.
    good = {f.name for f in (skill.examples / "stacks/good").iterdir()}
    kinds = {"trainer_": ".log", "dpo_": ".log", "verl_": ".log", "wandb_export_": ".csv", "lightning_": ".csv",
             "AGENTS_": ".md", "TRAINING_GUIDE_": ".md", "p1_reply_": ".md", "train_": ".py", "eval_": ".jsonl"}
    for prefix, suffix in kinds.items():
        assert len([n for n in good if n.startswith(prefix) and n.endswith(suffix)]) >= 2, prefix
    checked = {f for runs in GOOD_RUNS["stacks"] for f in runs[1]}
    assert {f"good/{n}" for n in good} == checked


def test_real_logs_keep_what_the_frameworks_print(skill):
    # The Trainer and TRL redraw tqdm bars with carriage returns; Ray prefixes and colours verl's lines.
    good = skill.examples / "stacks/good"
    with open(good / "dpo_beta01.log", encoding="utf-8", newline="") as f:
        assert "\r" in f.read()
    assert "\x1b[36m(TaskRunner pid=" in (good / "verl_ppo_console.log").read_text()
    assert (good / "lightning_forecast_metrics.csv").read_text().startswith("epoch,step,train_loss")
