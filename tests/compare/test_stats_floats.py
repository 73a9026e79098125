"""The float path of compare/stats.py (one call, every statistic a float) gives exactly what the
numpy path gives, value for value and NaN/None for NaN/None: outputs must not change with it."""
from __future__ import annotations

import itertools
import math
import random

from dumpcompare.compare import stats as S
from dumpcompare.compare.sides import as_dict

SPECIAL = (None, 0.0, -0.0, 1.0, -2.5, 1e-300, 3e300, -3e300, math.inf, -math.inf, math.nan)


def _numpy_errors(t: S.Stats, r: S.Stats) -> dict:
    return {k: S._scalar(v) for k, v in S.stat_error_calls(t, r).items()}


def _same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(
        (x is None and y is None) or (x is not None and y is not None and type(x) is type(y) is float
                                      and x == y and math.copysign(1, x) == math.copysign(1, y))
        for x, y in zip(a.values(), b.values()))


def _pairs():
    rng = random.Random(28)
    for _ in range(3000):
        def side():
            vals = [rng.choice(SPECIAL) if rng.random() < 0.3 else rng.uniform(-5, 5) for _ in range(4)]
            return vals
        numel = rng.choice((None, 0, 1, 4096, 10 ** 400))
        is_int = rng.random() < 0.1
        tv, rv = side(), side()
        if rng.random() < 0.3:          # near-equal sides, as most real pairs are
            rv = [v if v is None else v * (1 + rng.uniform(-1e-3, 1e-3)) for v in tv]
        yield (S.Stats(*tv, numel, "torch.float32", is_int),
               S.Stats(*rv, rng.choice((numel, numel, 4096)), "torch.float32", is_int))
    for tv in itertools.product((None, 0.0, 2.0, math.nan, math.inf), repeat=2):
        yield S.Stats(tv[0], tv[1], tv[0], tv[1], 8, None), S.Stats(tv[1], tv[0], tv[1], tv[0], 8, None)


def test_float_path_equals_the_numpy_path():
    checked = 0
    for t, r in _pairs():
        assert S._floats(t, r)
        fast, slow = as_dict(S.stat_errors(t, r)), _numpy_errors(t, r)
        assert _same(fast, slow), (t, r, fast, slow)
        assert S.nonfinite_one_side(t, r) == bool(S.nonfinite_one_side_calls(t, r).any()), (t, r)
        checked += 1
    assert checked > 3000


def test_arrays_and_integers_take_the_numpy_path():
    import numpy as np
    assert not S._floats(S.Stats(np.ones(2), None, None, None, 1, None), S.Stats(1.0, None, None, None, 1, None))
    assert not S._floats(S.Stats(11, 3, None, None, 4, "torch.int64", True),
                         S.Stats(11.0, 3.0, None, None, 4, "torch.int64", True))
