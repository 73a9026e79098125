"""read_curves: the four readings, each anomaly flag on its own, and the pre-filled P1 table."""
import json
import math

import pytest

from check_quotes import extract_quotes, found, log_lines
from check_tables import TableChecker
from metric_logs import load_metric_log
from mldebug_common import parse_tables
from read_curves import analyse, backwards_steps, is_set_value, p1_table


def curve(tmp_path, values, name="loss", steps=None):
    steps = steps if steps is not None else [10 * i for i in range(len(values))]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps({"step": s, name: v}) for s, v in zip(steps, values)) + "\n")
    log = load_metric_log(str(path))
    return log, analyse(log, name, "step", 10.0, name == "loss")


def smooth(n=100):
    return [2.0 * math.exp(-i / 30) + 0.5 + 0.01 * math.sin(i * 1.7) for i in range(n)]


def test_four_points_by_step(tmp_path):
    _, c = curve(tmp_path, smooth(101))
    assert {k: v[0] for k, v in c.points.items()} == {"start": 0, "early": 100, "middle": 500, "end": 1000}
    assert c.findings == []


def test_nonfinite_flagged_with_first_step(tmp_path):
    values = smooth()
    values[40] = float("nan")
    values[41] = float("inf")
    _, c = curve(tmp_path, values)
    assert [f.rule for f in c.findings] == ["NONFINITE"]
    assert "at step 400 (2 non-finite of 100)" in c.findings[0].message
    assert c.findings[0].line == 41


def test_spike_flagged(tmp_path):
    values = smooth()
    values[60] = 9.0
    _, c = curve(tmp_path, values)
    assert [f.rule for f in c.findings] == ["SPIKE"]
    assert "jumps to 9 at step 600" in c.findings[0].message


def test_fast_early_descent_is_not_a_spike(tmp_path):
    values = [10.0, 6.0, 4.0, 3.0] + smooth(96)
    _, c = curve(tmp_path, values)
    assert c.findings == []


def test_flat_tail_flagged(tmp_path):
    values = smooth(60) + [0.731] * 40
    _, c = curve(tmp_path, values)
    assert [f.rule for f in c.findings] == ["FLAT"]
    assert "stays exactly 0.731 from step 600 (40 points)" in c.findings[0].message


def test_divergence_by_magnitude(tmp_path):
    values = smooth(90) + [5 * 2.0 ** i for i in range(10)]
    _, c = curve(tmp_path, values)
    assert "DIVERGE" in [f.rule for f in c.findings]


def test_lower_is_better_metric_ending_above_its_start(tmp_path):
    values = [2.0 - i * 0.02 for i in range(50)] + [1.0 + i * 0.03 for i in range(50)]
    _, c = curve(tmp_path, values)
    assert [f.rule for f in c.findings] == ["DIVERGE"]
    assert "above its start 1.91 (with no step-to-step noise)" in c.findings[0].message
    _, acc = curve(tmp_path, values, name="acc")
    assert acc.findings == []


def test_step_going_back_is_flagged(tmp_path):
    steps = list(range(0, 500, 10)) + list(range(300, 800, 10))
    log, _ = curve(tmp_path, smooth(100), steps=steps)
    found_back = backwards_steps(log, "step")
    assert [f.rule for f in found_back] == ["STEP-BACK"]
    assert "from 490 to 300" in found_back[0].message


def test_p1_table_is_parseable_has_quotes_and_waits_for_the_human(tmp_path):
    values = smooth()
    values[60] = 9.0
    log, c = curve(tmp_path, values)
    table_text = p1_table([c])
    table = parse_tables(table_text)[0]
    assert table.header[:3] == ["risky part", "expected", "start"]
    row = table.rows[0]
    assert row[2] == f"{values[0]:.4g} (step 0)"
    assert '"step": 600' in row[6]
    rules = [f.rule for f in TableChecker("p1.md", table_text).check()]
    assert rules == ["CELL-EMPTY", "CELL-EMPTY"]
    quotes = extract_quotes(table_text)
    assert quotes and all(found(q, log_lines((tmp_path / "m.jsonl").read_text())) for _, q in quotes)


def test_p1_table_quotes_long_lines_with_an_ellipsis_and_escaped_pipes(tmp_path):
    path = tmp_path / "t.log"
    filler = "x" * 300
    path.write_text("".join(f"step={i} loss={2 - i / 100} | note={filler}\n" for i in range(20)))
    log = load_metric_log(str(path))
    c = analyse(log, "loss", "step", 10.0, True)
    table_text = p1_table([c])
    quotes = extract_quotes(table_text)
    assert quotes[0][1].endswith("\u2026")
    assert found(quotes[0][1], log_lines(path.read_text()))


def test_example_run_log_readings(skill):
    log = load_metric_log(str(skill.examples / "run.log"))
    assert log.fmt == "text" and log.n_lines == 111
    c = analyse(log, "loss", "step", 10.0, True)
    assert c.points["start"][1] == pytest.approx(3.6528)
    assert c.points["end"][1] == pytest.approx(2.0343)
    assert c.findings[0].rule == "SPIKE" and c.findings[0].line == 76


def test_constant_schedule_is_not_flat(tmp_path):
    # constant_with_warmup: ten warmup steps, then the configured value for the rest of the run.
    log, c = curve(tmp_path, [1e-6 * min(1, (i + 1) / 10) for i in range(200)], name="learning_rate")
    assert [f.rule for f in c.findings] == ["FLAT"]  # what a judged metric would get
    assert is_set_value("learning_rate", set()) and is_set_value("actor/lr", set())
    assert is_set_value("kl_coef", set()) and not is_set_value("reward", set())
    c = analyse(log, "learning_rate", "step", 10.0, False, set_value=True)
    assert c.findings == [] and "held at 1e-06 from step 90" in c.note
    log, _ = curve(tmp_path, [0.5] * 50, name="format_reward")
    assert [f.rule for f in analyse(log, "format_reward", "step", 10.0, False).findings] == ["FLAT"]
    assert analyse(log, "format_reward", "step", 10.0, False, set_value=True).findings == []


def test_expect_constant_from_the_shell(cli, write):
    path = write("m.jsonl", "\n".join(json.dumps({"step": i, "clip_ratio": 0.0, "loss": 1 / (i + 1)})
                                      for i in range(30)))
    assert "FLAT" in cli("read_curves", path).out
    res = cli("read_curves", path, "--expect-constant", "clip_ratio")
    assert res.code == 0 and "clip_ratio is a set value" in res.out


def test_loss_hovering_near_zero_is_not_diverging(tmp_path):
    rng = __import__("random").Random(1)
    values = [0.00005 * i + rng.gauss(0, 0.01) for i in range(200)]  # GRPO-like: noise around zero
    _, c = curve(tmp_path, values)
    assert c.findings == []


def test_real_divergence_states_its_numbers(tmp_path):
    rng = __import__("random").Random(2)
    values = [1.0 + rng.gauss(0, 0.02) for _ in range(150)] + [1.0 + 0.03 * i for i in range(50)]
    _, c = curve(tmp_path, values)
    assert [f.rule for f in c.findings] == ["DIVERGE"]
    msg = c.findings[0].message
    assert "median of the last 20 point(s)" in msg and "x its step-to-step noise" in msg


def test_mixed_jsonl_log_with_a_warning_from_the_shell(cli, write):
    lines = [json.dumps({"step": i, "epoch": i / 50, "loss": 2.0 / (i + 1) + 0.5}) for i in range(40)]
    lines.insert(5, "2026-11-20 09:58:40 - WARNING - trl - 3 completions were truncated")
    res = cli("read_curves", write("m.jsonl", "\n".join(lines)), "--json")
    assert res.code == 0
    log = res.json["logs"][0]
    assert log["skipped_lines"] == 1 and log["first_skipped"]["line"] == 6
    assert set(log["metrics"]) == {"loss"}  # epoch is an axis, not a metric
    assert "read by epoch" not in log["p1_table"]
