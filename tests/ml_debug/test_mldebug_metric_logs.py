"""Reading metrics logs as trainers write them: mixed lines, CSV exports, TensorBoard, axes."""
import json
import math

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


def test_hf_trainer_dict_lines_tqdm_and_warnings(tmp_path):
    path = tmp_path / "trainer.log"
    path.write_text("[WARNING|logging.py:328] >> `use_cache=True` is incompatible\n"
                    "{'loss': 2.1, 'grad_norm': 1.9, 'learning_rate': 2e-06, 'epoch': 0.01}\n"
                    " 10%|#         | 20/200 [03:00<27:00,  9.05s/it]\n"
                    "{'loss': nan, 'grad_norm': inf, 'learning_rate': 4e-06, 'epoch': 0.03}\n"
                    "{'eval_loss': 1.6, 'eval_runtime': 31.2, 'epoch': 0.03}\n")
    log = ml.load_metric_log(str(path))
    step = log.step_key()
    assert step == "epoch"
    assert log.metrics(step) == ["loss", "grad_norm", "learning_rate", "eval_loss", "eval_runtime"]
    losses = [v for _, v, _ in log.series("loss", step)]
    assert losses[0] == 2.1 and math.isnan(losses[1])
    assert log.skipped == 2 and log.first_skipped[0] == 1


def test_dict_line_is_never_evaluated_as_code(tmp_path):
    path = tmp_path / "evil.log"
    path.write_text("{'loss': __import__('os').getcwd()}\nstep=1 loss=2.0\n")
    log = ml.load_metric_log(str(path))
    assert log.skipped == 1 and [r.values for r in log.rows] == [{"step": 1.0, "loss": 2.0}]


def test_axis_columns_are_not_metrics(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps({"global_step": s, "epoch": s / 10, "timestamp": 1.7e9 + s,
                                          "_runtime": 3.0 * s, "train/loss": 1.0 / (s + 1)})
                              for s in range(6)))
    log = ml.load_metric_log(str(path))
    assert log.step_key() == "global_step"
    assert log.metrics("global_step") == ["train/loss"]


def test_wandb_csv_export(tmp_path):
    # W&B chart export: a Step column, one column per run and metric, and __MIN/__MAX companions.
    path = tmp_path / "wandb_export.csv"
    path.write_text('"Step","grpo-7 - train/reward","grpo-7 - train/reward__MIN","grpo-7 - train/reward__MAX"\n'
                    '"1","0.21","0.1","0.3"\n"2","0.25","0.12","0.33"\n"3","","",""\n"4","0.31","0.2","0.4"\n')
    log = ml.load_metric_log(str(path))
    assert log.step_key() == "Step" and log.metrics("Step") == ["train/reward"]
    assert [v for _, v, _ in log.series("train/reward", "Step")] == [0.21, 0.25, 0.31]
    assert "W&B export" in log.notes[0]


def test_mlflow_long_csv(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("key,value,step,timestamp\nloss,2.0,0,1700000000\nloss,1.5,1,1700000010\n"
                    "eval_acc,0.4,1,1700000011\nloss,1.2,2,1700000020\n")
    log = ml.load_metric_log(str(path))
    assert log.metrics(log.step_key()) == ["loss", "eval_acc"]
    assert [(s, v) for s, v, _ in log.series("loss", "step")] == [(0, 2.0), (1, 1.5), (2, 1.2)]


def test_tensorboard_without_the_package_says_so(tmp_path, monkeypatch):
    path = tmp_path / "events.out.tfevents.1700000000.host"
    path.write_bytes(b"\x00\x01binary")
    monkeypatch.setitem(__import__("sys").modules, "tensorboard", None)
    with pytest.raises(ml.InputError, match="needs the optional 'tensorboard' package"):
        ml.load_metric_log(str(path))


def test_tensorboard_event_file(tmp_path):
    writer_mod = pytest.importorskip("tensorboard.summary.writer.event_file_writer")
    summary_pb2 = pytest.importorskip("tensorboard.compat.proto.summary_pb2")
    event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")
    writer = writer_mod.EventFileWriter(str(tmp_path))
    for step, loss in enumerate((2.0, 1.5, 1.1)):
        value = summary_pb2.Summary.Value(tag="train/loss", simple_value=loss)
        writer.add_event(event_pb2.Event(step=step, summary=summary_pb2.Summary(value=[value])))
    writer.close()
    path = next(tmp_path.glob("*tfevents*"))
    log = ml.load_metric_log(str(path))
    assert log.fmt == "tensorboard" and log.step_key() == "step"
    assert [v for _, v, _ in log.series("train/loss", "step")] == pytest.approx([2.0, 1.5, 1.1])
