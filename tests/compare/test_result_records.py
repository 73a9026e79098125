"""The slotted records a result holds (compare/sides.py) read and are written exactly as the dicts
they replace: output_3 must not change with them (issue 28, item 4)."""
from __future__ import annotations

import json
import math

import pytest

from dumpcompare import outputs
from dumpcompare.compare.executor import Result
from dumpcompare.compare.sides import Side, SideStats, StatErrors, StatsSide, as_dict, with_stats
from dumpcompare.compare.stats import Stats, stat_errors


def _written(obj) -> str:
    """The compact JSON of ``obj`` as output_3 writes one result, and its indented form."""
    return outputs._compact(obj) + "\n" + outputs._encode({"x": obj}, indent=1)


def _reads_as(rec, d: dict) -> None:
    assert _written(rec) == _written(d)
    assert outputs.clean(rec) == outputs.clean(d)
    assert as_dict(rec) == d and list(as_dict(rec)) == list(d)
    for k, v in d.items():
        assert k in rec and (rec[k] is v) and rec.get(k) is v
    assert "absent" not in rec and rec.get("absent", 3) == 3
    with pytest.raises(KeyError):
        rec["absent"]


def test_side_stats_reads_and_is_written_as_its_dict():
    d = {"max": 2.0, "min": -1.0, "mean": math.nan, "norm": math.inf, "numel": 12}
    _reads_as(SideStats(2.0, -1.0, d["mean"], d["norm"], 12), d)
    assert '"mean":"NaN","norm":"Infinity"' in _written(SideStats(2.0, -1.0, d["mean"], d["norm"], 12))


def test_side_with_and_without_stats_reads_and_is_written_as_its_dict():
    lists = (["model.norm"], ["Module.model.norm.RMSNorm.forward.0"], ["output.0"], ["torch.float32"], [[4, 8]],
             [None])
    d = dict(zip(("modules", "keys", "leaves", "dtypes", "shapes", "merges"), lists))
    side = Side(*lists)
    _reads_as(side, d)
    stats = SideStats(1.0, 0.0, 0.5, 3.0, 32)
    held = with_stats(side, stats)
    assert type(held) is StatsSide
    _reads_as(held, {**d, "stats": stats})
    assert json.loads(outputs._compact(held))["stats"] == as_dict(stats)
    # A tensor comparison's statistics replace the first ones in place in the written order.
    again = with_stats(held, SideStats(1.0, 0.0, 0.25, 3.0, 32))
    assert list(json.loads(outputs._compact(again))) == list(d) + ["stats"] and again["stats"]["mean"] == 0.25
    # A side kept as a dict (with calls) gets its statistics last, as before.
    assert list(with_stats({**d, "calls": [1]}, stats)) == list(d) + ["calls", "stats"]


def test_stat_errors_reads_and_is_written_as_its_dict():
    errors = stat_errors(Stats(2.0, -1.0, 0.5, 4.0, 16, "torch.float32"),
                         Stats(2.5, -1.0, 0.5, 4.5, 16, "torch.float32"))
    assert type(errors) is StatErrors
    d = {"max_diff": 0.5, "max_rel": 0.25, "min_diff": 0.0, "min_rel": 0.0, "mean_diff": 0.0, "mean_rel": 0.0,
         "norm_diff": 0.5, "norm_rel": 0.125, "scaled_error": 0.2}
    assert as_dict(errors) == d
    _reads_as(errors, as_dict(errors))


def test_a_result_without_notes_is_written_with_an_empty_list_and_notes_add_in_order():
    res = Result("C0000", "L0.q", "direct", "features", "statistics", "match", 0.0, 1e-3, 1e-4, {}, {})
    assert json.loads(outputs._compact(res))["notes"] == []
    res.note()
    assert res.notes == ()
    res.note("first", "second")
    res.note("third")
    assert json.loads(outputs._compact(res))["notes"] == ["first", "second", "third"]


def test_the_zero_differences_of_equal_statistics_are_one_shared_float():
    # Half the statistics errors of the many-module pair are zero: one object, not one per value.
    t = Stats(2.0, -1.0, 0.5, 4.0, 16, "torch.float32")
    r = Stats(2.0, -1.0, 0.5 + 2 ** -20, 4.0, 16, "torch.float32")
    e = as_dict(stat_errors(t, r))
    zeros = [v for k, v in e.items() if not k.startswith("mean") and k != "scaled_error"]
    assert zeros == [0.0] * 6 and all(v is zeros[0] for v in zeros)
    assert e["mean_diff"] == 2 ** -20 and e["scaled_error"] > 0
    assert stat_errors(t, t)["scaled_error"] is zeros[0]
    # A negative zero stays what it is (written as -0.0).
    neg = stat_errors(Stats(0.0, 0.0, None, None, 4, "torch.float32"), Stats(-0.0, 0.0, None, None, 4, "torch.float32"))
    assert math.copysign(1.0, neg["max_diff"]) == -1.0 and neg["max_rel"] == 0.0
