"""Issue 27: the checkers on projects unlike ours, one test per class of misread, each from its cause."""
import json
import math
import textwrap

import numpy as np
import pytest

from check_evidence_criteria import check_block
from check_quotes import LENGTH_CLAIM, INNER_DOT
from check_training_guide import GuideChecker, sequence_markers
from metric_logs import load_metric_log
from mldebug_common import count_lines, find_credences
from read_curves import after_the_fault, analyse, fixed_decimals, last_digit, printed_resolution
from scan_silent_bugs import scan_file


def log_file(tmp_path, values, decimals, name="loss", extra=None):
    """A key=value log printing `name` with a fixed number of decimals, as verl's `{v:.3f}` does."""
    lines = []
    for i, v in enumerate(values):
        more = "".join(f" {k}={vals[i]:.{decimals}f}" for k, vals in (extra or {}).items())
        lines.append(f"step={i + 1} {name}={v:.{decimals}f}{more}")
    path = tmp_path / "run.log"
    path.write_text("\n".join(lines) + "\n")
    return load_metric_log(str(path))


# --- printed resolution ------------------------------------------------------------------------


def test_last_digit_is_the_printed_resolution():
    assert last_digit(0.69) == pytest.approx(0.01) and last_digit(3.502) == pytest.approx(0.001)
    assert last_digit(1.2e-05) == pytest.approx(1e-06) and last_digit(0.0) == 0.0
    assert printed_resolution(np.array([0.69, 0.70, 0.71, 0.68])) == pytest.approx(0.01)


@pytest.mark.parametrize("decimals", [2, 3])
def test_one_unit_of_the_last_printed_digit_is_no_spike(tmp_path, decimals):
    # A value near 0.5 printed to k decimals: most steps repeat it, a few move one unit.
    unit = 10.0 ** -decimals
    values = [0.5 + unit * (i % 7 == 3) for i in range(60)]
    log = log_file(tmp_path, values, decimals)
    assert analyse(log, "loss", "step", 10.0, True).findings == []


@pytest.mark.parametrize("decimals", [2, 3])
def test_a_real_jump_at_the_same_resolution_is_a_spike(tmp_path, decimals):
    unit = 10.0 ** -decimals
    values = [0.5 + unit * (i % 7 == 3) for i in range(60)]
    values[33] = 0.5 + 40 * unit
    log = log_file(tmp_path, values, decimals)
    found = analyse(log, "loss", "step", 10.0, True).findings
    assert [f.rule for f in found] == ["SPIKE"] and "at step 34" in found[0].message


def test_a_rise_within_the_rounding_of_a_near_zero_loss_is_no_divergence(tmp_path):
    # A GRPO-style loss hovering at zero, printed with three decimals, ends one unit above its start.
    values = [0.001 * (i % 10 == 0) for i in range(70)] + [0.001 * (i % 10 != 0) for i in range(20)]
    found = analyse(log_file(tmp_path, values, 3), "loss", "step", 10.0, True).findings
    assert "DIVERGE" not in [f.rule for f in found]
    values[-10:] = [0.05] * 10  # fifty units up at the same resolution is a rise
    found = analyse(log_file(tmp_path, values, 3), "loss", "step", 10.0, True).findings
    assert "DIVERGE" in [f.rule for f in found]


def test_a_value_below_a_fixed_resolution_is_a_note_not_flat(tmp_path):
    # KL of about 0.001 printed with three decimals reads 0.001 on every step: the printer hides it.
    rng = np.random.default_rng(0)
    log = log_file(tmp_path, [0.0012] * 40, 3, name="kl", extra={"reward": 0.3 + 0.05 * rng.random(40)})
    fixed = fixed_decimals(log)
    assert fixed == pytest.approx(0.001)
    curve = analyse(log, "kl", "step", 10.0, False, fixed_resolution=fixed)
    assert curve.findings == [] and "too coarse to see it move" in curve.note
    # A round value that the printer does not hide (accuracy held at 0.5 of a full-precision log) is flat.
    held = analyse(log_file(tmp_path, [0.5] * 40, 3, name="acc"), "acc", "step", 10.0, False)
    assert [f.rule for f in held.findings] == ["FLAT"]


# --- line prefixes, carriage returns, fields -----------------------------------------------------


def test_a_launchers_pid_prefix_is_not_a_metric(tmp_path):
    path = tmp_path / "console.log"
    path.write_text("".join(f"\x1b[36m(TaskRunner pid=4821)\x1b[0m step:{i} - actor/entropy:{1 - i / 100:.3f}\n"
                            for i in range(1, 41)))
    log = load_metric_log(str(path))
    assert log.metrics(log.step_key()) == ["actor/entropy"]
    read = log.read_summary(log.step_key())
    assert read.ignored["pid"].startswith("who wrote the line")
    assert "ignored pid (who wrote the line" in read.human()


def test_tqdm_redraws_keep_editor_line_numbers(tmp_path):
    path = tmp_path / "trainer.log"
    path.write_bytes(b" 5%|5   | 1/20 [00:01<00:09]\r{'loss': '0.69', 'epoch': '0.05'}\n"
                     b"warning: something\n"
                     b"10%|#   | 2/20 [00:02<00:08]\r{'loss': '0.68', 'epoch': '0.1'}\n")
    log = load_metric_log(str(path))
    with open(path, encoding="utf-8", newline="") as f:
        assert log.n_lines == 3 == count_lines(f.read())
    assert [row.line for row in log.rows] == [1, 3]


def test_pipe_separated_name_value_fields_are_read(tmp_path):
    path = tmp_path / "loop.log"
    path.write_text("".join(f"epoch 0 step {i} | loss {2 / i:.4f} | lr 3.0e-03\n" for i in range(1, 21))
                    + "45%|####     | 9/20 [00:03<00:04, 2.5it/s]\n")
    log = load_metric_log(str(path))
    assert log.step_key() == "step" and set(log.metrics("step")) == {"loss", "lr"}
    assert log.skipped == 1


# --- spikes that are not --------------------------------------------------------------------------


def test_a_dip_over_several_points_is_no_spike(skill, tmp_path):
    # The mean rejected logit of the real TRL run crosses zero for three logs near epoch 0.3.
    log = load_metric_log(str(skill.examples / "stacks/good/dpo_beta05.log"))
    values = [v for _, v, _ in log.series("logits/rejected", "epoch")]
    assert min(values[3:8]) < 0 < min(values[:3])
    assert analyse(log, "logits/rejected", "epoch", 10.0, False).findings == []
    # The same shape one point wide is a spike.
    path = tmp_path / "m.jsonl"
    narrow = list(values)
    narrow[4], narrow[6] = narrow[3], narrow[7]
    path.write_text("".join(json.dumps({"step": i, "x": v}) + "\n" for i, v in enumerate(narrow)))
    found = analyse(load_metric_log(str(path)), "x", "step", 10.0, False).findings
    assert [f.rule for f in found] == ["SPIKE"] and "at step 5 " in found[0].message


def test_noise_is_judged_in_its_own_stretch_of_the_run(tmp_path):
    # A single-batch loss: large jumps in its first fast descent, small ones later.
    rng = np.random.default_rng(3)
    values = [(40 * math.exp(-i / 6) + 0.1) * (1 + 0.2 * rng.standard_normal()) for i in range(60)]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": i, "loss": abs(v)}) + "\n" for i, v in enumerate(values)))
    assert analyse(load_metric_log(str(path)), "loss", "step", 10.0, True).findings == []


def test_a_move_after_another_metrics_fault_is_its_echo(tmp_path):
    n = 100
    loss = [1.0 - 0.002 * i for i in range(90)] + [2.0 ** k for k in range(1, 11)]
    reward = [0.5 + 0.001 * math.sin(i) for i in range(n)]
    reward[95] = 0.1  # the reward drops once while the loss blows up
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": i, "loss": loss[i], "reward": reward[i]}) + "\n"
                            for i in range(n)))
    log = load_metric_log(str(path))
    curves = [analyse(log, m, "step", 10.0, m == "loss") for m in ("loss", "reward")]
    assert "SPIKE" in [f.rule for f in curves[1].findings]
    kept = after_the_fault(curves)
    assert [f.rule for f in kept[0].findings] == ["DIVERGE"] and kept[1].findings == []
    assert "after loss's fault starts" in kept[1].note
    # The same drop before the fault is its own problem and stays.
    reward[95], reward[40] = reward[40], 0.1
    path.write_text("".join(json.dumps({"step": i, "loss": loss[i], "reward": reward[i]}) + "\n"
                            for i in range(n)))
    log = load_metric_log(str(path))
    kept = after_the_fault([analyse(log, m, "step", 10.0, m == "loss") for m in ("loss", "reward")])
    assert [f.rule for f in kept[1].findings] == ["SPIKE"]


# --- documents -----------------------------------------------------------------------------------


def test_a_log_length_sentence_behind_a_dotted_path_is_checked():
    text = "The log runs/dpo.beta0.1/stdout.2026-11-30.txt has 28 lines, and I read them."
    assert [m.group(1) for m in LENGTH_CLAIM.finditer(INNER_DOT.sub("_", text))] == ["28"]
    assert not LENGTH_CLAIM.search(text)  # what the old reading saw: the dot ended the sentence


BLOCK = textwrap.dedent("""\
    Metrics: `eval/exact_match`.
    GOAL: The model answers more held-out questions correctly after tuning.
    OPTIMISING: The reward is one when the final answer equals the reference.
    PERVERSE SATISFACTIONS:
      - Printing many numbers so that one is right; shows in the share of answers with five numbers.
      - Answering with a bare number; {second}
    EVIDENCE A: answers read for the bare, treatment, reversed and placebo arms.
    EVIDENCE B: {evidence_b}
    ELSE: if the number rises but the answers read are wrong, the scorer is broken.
    """)


@pytest.mark.parametrize("evidence_b", ["beats the base model: `eval/exact_match` up five points.",
                                        "beats the base model by five points in eval/exact_match."])
def test_evidence_b_may_name_its_metric_in_backticks_or_as_a_path(evidence_b):
    text = BLOCK.format(second="exposed by the falling response length.", evidence_b=evidence_b)
    assert check_block("AGENTS.md", text) == []


@pytest.mark.parametrize("second, rules", [
    ("exposed by the falling response length.", []),
    ("exposed by the fraction of answers shorter than five tokens.", []),
    ("caught by `short_answer_frac`.", ["EC-PERVERSE-EXPOSE"]),  # a logged key must be one the document has
    ("exposed by a metric.", ["EC-PERVERSE-EXPOSE"]),
])
def test_an_exposure_in_plain_words_needs_no_definitions_table(second, rules):
    text = BLOCK.format(second=second, evidence_b="beats the base model on `eval/exact_match`.")
    assert [f.rule for f in check_block("AGENTS.md", text)] == rules


GUIDE = textwrap.dedent("""\
    ---
    last_reviewed_job: 4
    stages: {{update: working, held out: unknown}}
    ---
    # guide
    ## update
    Purpose: the loss falls.
    Expected sequence: 1. vf_loss falls below 0.1 by step 40. 2. kl stays under 0.01. 3. score passes 0.5.
    Required observations: vf_loss, kl, score.
    Current evidence: job 4.
    Missing evidence: none.
    Status: working, {credence}.
    Earliest unsupported link: none, all three were seen in job 4.
    Main question: does it hold at a second seed?
    ## held out
    Purpose: accuracy rises.
    Expected sequence: 1. eval at step 0. 2. eval at the end.
    Required observations: both evals.
    Current evidence: the final eval only.
    Missing evidence: the step-0 eval.
    Status: {unknown}
    Earliest unsupported link: step 1
    Main question: what did step 0 score?
    """)


def guide_rules(credence="likely, 65%", unknown="unknown; needs the step-0 eval (job 5)."):
    return [f.rule for f in GuideChecker("g.md", GUIDE.format(credence=credence, unknown=unknown)).check()]


def test_numbers_inside_a_step_are_not_markers():
    assert sequence_markers("1. falls below 0.1 by step 40. 2. kl under 0.01. 3. passes 0.5.") == [1, 2, 3]
    assert guide_rules() == []


def test_an_unknown_status_with_a_hedge_is_a_claim():
    assert guide_rules(unknown="unknown; needs the step-0 eval (job 5), but it probably improved.") == \
        ["TG-UNKNOWN-CLAIM"]
    assert guide_rules(unknown="unknown; seems fine, needs the step-0 eval.") == ["TG-UNKNOWN-CLAIM"]


def test_even_chance_is_the_middle_word():
    assert [(c.word, c.number) for c in find_credences("uncertain, even chance, 50%")] == [("even", 50.0)]
    assert guide_rules(credence="even chance, 50%") == []


# --- code idioms -----------------------------------------------------------------------------------


def scan(tmp_path, source):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(source))
    return [f.rule for f in scan_file(str(path), False)[0]]


@pytest.mark.parametrize("call", ["policy_loss(logp, logp.detach(), adv)",
                                  "policy_loss(logp=logp, old_log_prob=logp.detach(), adv=adv)",
                                  "policy_loss(logp, logp.detach() if cached is None else cached, adv)"])
def test_the_on_policy_ratio_from_a_tensor_and_its_detached_copy_is_benign(tmp_path, call):
    assert scan(tmp_path, f"""\
        import torch
        def step(logp, adv, cached=None):
            loss = {call}
            loss.backward()
        """) == []


def test_a_detach_that_cuts_the_ratio_is_still_flagged(tmp_path):
    assert scan(tmp_path, """\
        import torch
        def policy_loss(logp, old_logp, adv):
            return -(torch.exp(logp.detach() - old_logp) * adv).mean()
        """) == ["SB-DETACH"]


LOOP = """\
    import torch
    def evaluate(model, loader):
        model.eval()
        with torch.no_grad():
            return sum(model(x).sum().item() for x in loader)
        {back}
    def fit(model, opt, loader):
        for step, x in enumerate(loader):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            if step % 100 == 0:
                print(evaluate(model, loader))
    """


def test_eval_switched_on_in_a_helper_and_never_back_is_found(tmp_path):
    assert scan(tmp_path, LOOP.format(back="")) == ["SB-EVAL-NO-TRAIN"]
    assert scan(tmp_path, LOOP.format(back="model.train()")) == []


# --- collapse ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("outputs, rules", [(["billing"] * 12, {"COLLAPSED"}),
                                            (["billing"] * 11 + ["refund"], set()),
                                            (["billing"] * 6, set())])
def test_a_classifier_answering_one_class_has_collapsed(cli, tmp_path, outputs, rules):
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"id": i, "input": f"ticket {i}", "output": o, "correct": i % 2}) + "\n"
                            for i, o in enumerate(outputs)))
    res = cli("sample_outputs", path, "--json")
    assert {f["rule"] for f in res.json["findings"]} == rules and res.code == (1 if rules else 0)


# --- what was read ------------------------------------------------------------------------------------


def test_every_checker_says_what_it_read_before_its_findings(cli, skill):
    good = skill.examples / "stacks/good"
    res = cli("read_curves", skill.examples / "stacks/broken/verl_ppo_console_nan.log")
    first, *rest = res.out.splitlines()
    assert first.endswith("verl_ppo_console_nan.log: read: text, 129 lines, metrics actor/pg_loss, actor/entropy, "
                          "actor/ppo_kl, actor/pg_clipfrac, actor/grad_norm, actor/lr, critic/score/mean, "
                          "critic/vf_loss, response_length/mean, timing_s/step, ignored pid (who wrote the line "
                          "(a launcher's prefix), not a measurement); dataloader, steps, "
                          "val-core/gsm8k/reward/mean@1 (only on rows without step); step (the step axis)")
    assert res.code == 1 and any(": NONFINITE: critic/vf_loss is nan at step 70" in ln for ln in rest)
    js = cli("read_curves", skill.examples / "stacks/broken/verl_ppo_console_nan.log", "--json").json
    assert js["read"][0]["format"] == "text" and js["read"][0]["lines"] == 129
    assert {"name": "pid", "why": "who wrote the line (a launcher's prefix), not a measurement"} in \
        js["read"][0]["ignored"]
    for checker, files in [("check_training_guide", ["TRAINING_GUIDE_terse.md"]),
                           ("check_evidence_criteria", ["AGENTS_terse.md"]),
                           ("check_tables", ["p1_reply_verl.md"]),
                           ("check_quotes", ["p1_reply_verl.md", "verl_ppo_console.log"]),
                           ("scan_silent_bugs", ["ppo_loss.py"]),
                           ("sample_outputs", ["eval_intent.jsonl"]),
                           ("check_overfit", ["trainer_clm.log", "--relative", "0.6"]),
                           ("paired_compare", [skill.examples / "sft/good/results.csv", "--a", "sft", "--b", "base"])]:
        args = [good / f if isinstance(f, str) and f.endswith((".md", ".log", ".py", ".jsonl")) else f for f in files]
        out = cli(checker, *args)
        paths = [a for a in args if not isinstance(a, str)]
        assert out.code == 0, (checker, out.out, out.err)
        head = out.out.splitlines()[:len(paths)]
        assert all(f"{p}: read: " in line for p, line in zip(paths, head)), (checker, head)
        reads = cli(checker, *args, "--json").json["read"]
        assert [r["file"] for r in reads] == [str(p) for p in paths] and all(r["lines"] > 0 for r in reads)
