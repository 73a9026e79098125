"""Views that replace tables the compare step held per record and per pair (issue 28, item 4): each
reads as the dict it replaces, and output_2 is written from it as before."""
from __future__ import annotations

import json

from dumpcompare import outputs
from dumpcompare.compare import EntryLeaves
from dumpcompare.compare.leafindex import SCAN_MAX
from dumpcompare.naming import ModuleRecord, Port
from dumpcompare.plan import Pair, PortPoints
from dumpcompare.records import Entry, Leaf


def _entry(names: list[str]) -> Entry:
    return Entry("k", 0, "module", "m", "Linear", "forward", 0, [Leaf(n, "torch.float32", (2,)) for n in names])


def _as_before(e: Entry) -> dict:
    return {lf.name: lf for lf in e.leaves}


def test_entry_leaves_read_as_the_dict_per_record_they_replace():
    few = _entry(["input_args.0", "output.0", "parameters.weight", "output.0"])      # a name twice: the last wins
    wide = _entry([f"output.{i}" for i in range(SCAN_MAX + 5)] + ["output.3"])
    table = EntryLeaves([few, wide])
    assert len(table) == 2
    for i, e in enumerate((few, wide)):
        got, want = table[i], _as_before(e)
        assert got == want and list(got) == list(want) and len(got) == len(want)
        assert list(got.values()) == list(want.values())
        for name, lf in want.items():
            assert name in got and got[name] is lf and got.get(name) is lf
        assert "output.99" not in got and got.get("output.99") is None
    assert table[0]["output.0"] is few.leaves[3]
    assert table[1]["output.3"] is wide.leaves[-1]
    assert table[1] is table[1]          # a wide record's dict is made once


def _rec(index: int, ports: list[tuple[str, str, str]]) -> ModuleRecord:
    return ModuleRecord("train", index, f"k{index}", "module", "forward", f"m{index}", f"m{index}", "Linear", 0, 0,
                        f"m{index}", "x", "mlp", "hf", ports=[Port(*p) for p in ports])


def test_port_points_read_and_are_written_as_the_point_lists_they_replace():
    a = _rec(0, [("input_args.0", "L0.x", "in"), ("output.0", "L0.y", "out"), ("parameters.weight", "L0.w", "param")])
    b = _rec(1, [("input_args.0", "L0.y", "in"), ("output.0", "L0.z", "out"), ("input_args.1", "L0.x", "in"),
                 ("output.1", "L0.y", "out")])
    own = PortPoints([a], True)
    assert dict(own) == {"in": ["L0.x"], "out": ["L0.y"], "param": ["L0.w"]}
    both = PortPoints([a, b], False)
    # Each point once, in the order first carried, per io.
    assert dict(both) == {"in": ["L0.x", "L0.y"], "out": ["L0.y", "L0.z"], "param": ["L0.w"]}
    assert list(both) == ["in", "out", "param"] and len(both) == 3
    pair = Pair("P0000", "by_design_difference", [0], [1], 0, "mlp", "x", points=both)
    written = outputs._compact({"points": dict(pair.points)})
    assert json.loads(written)["points"] == {"in": ["L0.x", "L0.y"], "out": ["L0.y", "L0.z"], "param": ["L0.w"]}
    assert written == outputs._compact({"points": {"in": ["L0.x", "L0.y"], "out": ["L0.y", "L0.z"],
                                                   "param": ["L0.w"]}})
