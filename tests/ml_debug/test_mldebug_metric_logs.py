"""Reading metrics logs as trainers write them: mixed lines, CSV exports, TensorBoard, axes."""
import json

import pytest

import metric_logs as ml


def test_metric_log_formats_agree(tmp_path):
    rows = [{"step": s, "loss": 2.0 - s / 10} for s in range(5)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "a.csv").write_text("step,loss\n" + "\n".join(f"{r['step']},{r['loss']}" for r in rows))
    (tmp_path / "a.log").write_text("boot ok\n" + "\n".join(
        f"12:00:0{r['step']} INFO step={r['step']} loss: {r['loss']}" for r in rows))
    series = []
    for name in ("a.jsonl", "a.csv", "a.log"):
        log = ml.load_metric_log(str(tmp_path / name))
        key = log.step_key()
        assert key == "step"
        series.append([(s, v) for s, v, _ in log.series("loss", key)])
    assert series[0] == series[1] == series[2]


def test_metric_log_nested_json_nan_and_config_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "eval": {"loss": NaN}}\n{"lr": 0.1}\n{"step": 2, "eval": {"loss": 1.5}}\n')
    log = ml.load_metric_log(str(path))
    values = [v for _, v, _ in log.series("eval/loss", "step")]
    assert len(values) == 2 and values[1] == 1.5
    assert log.series("lr", "step") == []


def test_metric_log_skips_lines_that_hold_no_metric_and_says_which(tmp_path):
    (tmp_path / "mixed.jsonl").write_text('{"step": 1, "loss": 2.0}\nWARNING: not json\n{"step": 2, "loss": 1.5}\n')
    log = ml.load_metric_log(str(tmp_path / "mixed.jsonl"))
    assert [v for _, v, _ in log.series("loss", "step")] == [2.0, 1.5]
    assert log.skipped == 1 and log.first_skipped == (2, "WARNING: not json")
    assert "skipped 1 line(s) holding no metric, the first at line 2: 'WARNING: not json'" == log.skipped_text()


def test_metric_log_rejects_bad_input(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{oops\nnot json\n')
    with pytest.raises(ml.InputError, match=r"bad.jsonl: no numeric values.*skipped 2 line\(s\).*line 1: '\{oops'"):
        ml.load_metric_log(str(tmp_path / "bad.jsonl"))
    (tmp_path / "words.log").write_text("nothing numeric here\n")
    with pytest.raises(ml.InputError, match="no numeric values"):
        ml.load_metric_log(str(tmp_path / "words.log"))
    (tmp_path / "empty.log").write_text("\n")
    with pytest.raises(ml.InputError, match="empty.log: empty file"):
        ml.load_metric_log(str(tmp_path / "empty.log"))
    (tmp_path / "train.py").write_text("lr = 3e-4\n")
    with pytest.raises(ml.InputError, match="train.py: this is Python source, not a metrics log"):
        ml.load_metric_log(str(tmp_path / "train.py"))
