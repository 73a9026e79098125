"""Which part of a fused output departs, from its statistics: a part whose hypothesis ("only this
part changed") leaves the unchanged parts impossible inside the fused statistics is ruled out."""
import numpy as np

from dumpcompare.records import Leaf
from dumpcompare.refparts import suspects

TOL = 2e-4


def _leaf(a):
    w = a.astype(np.float64)
    return Leaf("output.0", "torch.float32", a.shape, float(w.max()), float(w.min()), float(w.mean()),
                float(np.sqrt((w * w).sum())))


def _case(gate, up, side_gate, side_up, ends):
    arrays = {"L0.gate": gate, "L0.up": up}
    side = np.concatenate([side_gate, side_up], axis=1)
    starts = [0] + ends[:-1]
    leaves = [_leaf(side[s:e]) for s, e in zip(starts, ends)]
    return suspects("L0.gate+L0.up", arrays, None, leaves, ends, TOL)


def test_a_shrunken_part_is_the_only_suspect():
    rng = np.random.default_rng(0)
    gate, up = 0.1 * rng.standard_normal((5, 8)), rng.standard_normal((5, 8))
    got = _case(gate, up, gate, 0.1 * up, [3, 4, 5])         # a prefill of 3, two decode calls
    assert got["suspects"] == ["L0.up"]
    assert "Max" in got["parts"]["L0.gate"] or "Min" in got["parts"]["L0.gate"] or "Norm" in got["parts"]["L0.gate"]


def test_statistics_that_fit_either_part_leave_both():
    rng = np.random.default_rng(1)
    gate, up = rng.standard_normal((4, 8)), rng.standard_normal((4, 8))
    got = _case(gate, up, gate, 3.0 * up, [4])
    assert got["suspects"] == ["L0.gate", "L0.up"]


def test_one_part_or_a_missing_reference_part_is_not_tested():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 4))
    assert suspects("L0.gate", {"L0.gate": a}, None, [_leaf(a)], [2], TOL) is None
    assert suspects("L0.gate+L0.up", {"L0.gate": a}, None, [_leaf(a)], [2], TOL) is None


def test_a_part_whose_extreme_value_stays_is_taken_as_unchanged():
    """A changed weight moves every value of its part; the unchanged part's largest value is still
    the fused output's Max (or its smallest the Min), and the other part's never is."""
    rng = np.random.default_rng(3)
    gate, up = 0.5 * rng.standard_normal((6, 16)), 2.0 * rng.standard_normal((6, 16))
    stale = gate + 0.2 * rng.standard_normal(gate.shape)
    got = _case(gate, up, stale, up, [3, 4, 5, 6])
    assert got["suspects"] == ["L0.gate"], got
    assert "unchanged" in got["parts"]["L0.up"]


def test_extremes_of_both_parts_held_narrow_nothing():
    """Each part holds one of the fused extremes at some call: a change confined to some values of
    a part can leave its extreme in place, so neither is cleared."""
    rng = np.random.default_rng(4)
    gate, up = rng.standard_normal((2, 8)), rng.standard_normal((2, 8))
    gate[0, 0], up[0, 1] = 9.0, -9.0             # gate holds call 0's Max, up its Min
    side_gate, side_up = gate.copy(), up.copy()
    side_gate[1] *= 1.5                          # the change: call 1's gate values
    got = _case(gate, up, side_gate, side_up, [1, 2])
    assert got["suspects"] == ["L0.gate", "L0.up"], got
