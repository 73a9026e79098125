"""Every checker from a shell: --help, exit 0 clean / 1 findings / 2 bad input, and --json."""
import json
from pathlib import Path

import pytest

SCRIPTS = ("check_training_guide", "check_evidence_criteria", "check_tables", "read_curves",
           "paired_compare", "scan_silent_bugs", "sample_outputs", "check_overfit", "check_quotes")

CLEAN_PY = """import torch.nn.functional as F
def step(model, opt, xb, yb):
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
"""


def inputs(skill, write):
    """(clean args, findings args, bad-input args) per script."""
    ex, assets = skill.examples, skill.assets
    clean_log = write("clean.jsonl", "\n".join(json.dumps({"step": i, "loss": 2.0 / (i + 1) + 0.01 * (i % 3)})
                                               for i in range(50)))
    clean_eval = write("clean_eval.jsonl", "\n".join(json.dumps({"id": i, "output": f"answer {i}", "score": i})
                                                     for i in range(6)))
    two_seeds = write("two.csv", "arm,seed,acc\na,0,0.5\nb,0,0.6\na,1,0.5\nb,1,0.61\n")
    return {
        "check_training_guide": ([assets / "TRAINING_GUIDE.md"],
                                 [write("g.md", (assets / "TRAINING_GUIDE.md").read_text()
                                        .replace("last_reviewed_job: 0", "last_reviewed_job: 0\nnote: x"))],
                                 ["missing_guide.md"]),
        "check_evidence_criteria": ([ex / "AGENTS.md"], [assets / "AGENTS_evidence_block.md"],
                                    [write("bin.md", "\x00\x01")]),
        "check_tables": ([ex / "p1_reply.md"], [assets / "P1_run_finished.md"], ["nope.md"]),
        "read_curves": ([clean_log], [ex / "run.log"], [write("bad.jsonl", "{oops\n")]),
        "paired_compare": ([ex / "results.csv", "--a", "lora", "--b", "base"], [two_seeds],
                           [write("noarm.csv", "group,seed,acc\nx,0,1\n")]),
        "scan_silent_bugs": ([write("clean.py", CLEAN_PY)], [ex / "train_buggy.py"], ["no_such_dir"]),
        "sample_outputs": ([clean_eval], [ex / "eval.jsonl"], [write("noscore.jsonl", '{"output": "a"}\n')]),
        "check_overfit": ([ex / "overfit.jsonl"], [write("high.jsonl", '{"step": 0, "loss": 2.3}\n{"step": 9, "loss": 1.2}\n')],
                          [write("noloss.jsonl", '{"step": 0, "acc": 0.1}\n')]),
        "check_quotes": ([ex / "p1_reply.md", ex / "run.log"], [ex / "p1_reply.md", clean_log],
                         [ex / "p1_reply.md", "missing.log"]),
    }


ALL_SCRIPTS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "ml-debug" / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_help(cli, script):
    # Library modules too (mldebug_common, metric_logs, tensor_flow): every file answers --help.
    res = cli(script, "--help")
    assert res.code == 0 and "usage:" in res.out and "--json" in res.out


def test_all_scripts_include_the_libraries():
    assert {"mldebug_common", "metric_logs", "tensor_flow"} | set(SCRIPTS) <= set(ALL_SCRIPTS)


WRONG_KIND = {
    "check_training_guide": ("TG-FM-MISSING", 1), "check_evidence_criteria": ("EC-MISSING", 1),
    "check_tables": ("NO-TABLES", 1), "read_curves": ("not a metrics log", 2),
    "check_overfit": ("not a metrics log", 2), "scan_silent_bugs": ("not a Python file", 2),
    "sample_outputs": ("not valid JSON", 2), "paired_compare": ("no 'arm' column", 2),
}


@pytest.mark.parametrize("script", sorted(WRONG_KIND))
def test_a_file_of_the_wrong_kind_is_never_ok(cli, write, script):
    # Each checker gets a file meant for another one: a Python script, or a log for the scanner.
    wrong = write("metrics.jsonl", '{"step": 1, "loss": 2.0}\n') if script == "scan_silent_bugs" \
        else write("train.py", "import torch\nlr = 3e-4\n")
    res = cli(script, wrong)
    text, code = WRONG_KIND[script]
    assert res.code == code and text in res.out + res.err and "OK" not in res.out


@pytest.mark.parametrize("script", ["read_curves", "check_overfit", "scan_silent_bugs", "paired_compare"])
def test_an_empty_file_is_never_ok(cli, write, script):
    res = cli(script, write("empty.py" if script == "scan_silent_bugs" else "empty.jsonl", ""))
    assert res.code == 2 and "empty file" in res.err


@pytest.mark.parametrize("script", SCRIPTS)
def test_exit_codes_and_json(cli, skill, write, script):
    clean, dirty, bad = inputs(skill, write)[script]
    ok = cli(script, *clean)
    assert ok.code == 0, ok.out + ok.err
    assert "OK" in ok.out.splitlines()[-1]
    found = cli(script, *dirty, "--json")
    assert found.code == 1, found.out + found.err
    assert found.json["schema_version"] == 1 and found.json["ok"] is False and found.json["findings"]
    assert {"file", "line", "rule", "message"} <= set(found.json["findings"][0])
    broken = cli(script, *bad)
    assert broken.code == 2
    assert broken.out == ""
    assert len(broken.err.strip().splitlines()) == 1 and "Traceback" not in broken.err
    assert broken.err.startswith(f"{script}: error: ")
    assert any(str(b).split("/")[-1] in broken.err for b in bad if not str(b).startswith("--"))


def test_usage_error_exits_2(cli):
    res = cli("check_tables")
    assert res.code == 2 and "usage:" in res.err


def test_read_curves_p1_table_from_shell(cli, skill):
    res = cli("read_curves", skill.examples / "run.log", "--p1-table", "--metrics", "loss,eval_acc")
    read, *lines = res.out.splitlines()
    assert read.endswith("run.log: read: text, 111 lines, metrics loss, eval_acc, ignored job, warmup, batch_size, "
                         "max_steps, seed, train_rows, eval_rows, max_len, steps, wall_time_s (only on rows without "
                         "step); lr, grad_norm, eval_loss (not asked for); step (the step axis)")
    assert lines[0] == "| risky part | expected | start | early | middle | end | quoted line |"
    assert lines[2].startswith("| <risky part read by loss> |") and "3.653 (step 0)" in lines[2]


def test_paired_compare_json_has_the_comparison(cli, skill):
    res = cli("paired_compare", skill.examples / "results.csv", "--a", "lora", "--b", "base", "--json")
    comp = res.json["comparisons"][0]
    assert comp["verdict"] == "lora higher" and comp["n_pairs"] == 6
    assert comp["sign_count"]["a_higher"] == 6 and comp["interval"][0] > 0
