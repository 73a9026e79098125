"""Tolerances and grades: the tolerance table (tolerances.yaml with
a user file merged over it), the pair tolerance of two dtypes, the grade of an error, and the
status groups every reader of output_3/output_4 shares (references/tolerances.md)."""
from __future__ import annotations

import math
from pathlib import Path

from .dtypes import dtype_key
from .userconfig import builtin, merge, read_user_yaml

_TOL_FILE = Path(__file__).with_name("tolerances.yaml")
# Graded statuses by how bad they are; "incomparable" and "structural" are not grades.
SEVERITY = {"match": 0, "drift": 1, "mismatch": 2, "nonfinite": 3}
# The statuses that say the two sides differ, and those that say they agree within tolerance.
DIVERGED = ("mismatch", "nonfinite")
CLEAN = ("match", "drift")
# Consistent, not verified: one side holds a token row more and every bound its statistics set on
# the other's holds (compare/bounds.py). Neither clean nor diverged: never an all-clear.
BOUNDED = ("bounded",)


def load_tolerances(user_file: str | None = None) -> dict:
    """Built-in tolerances, with a user YAML merged over them (safe loader only)."""
    tol = builtin(_TOL_FILE)
    return merge(tol, read_user_yaml(user_file, "tolerances", like=tol)) if user_file else tol


def tolerance_for(table: dict, dtype: str | None):
    """The entry of a tolerance table for one dtype (its ``default`` when the dtype has none)."""
    return table.get(dtype_key(dtype), table.get("default"))


def pair_tolerances(table: dict, dt: str | None, dr: str | None) -> tuple[float, float]:
    """(pair tolerance = looser, strict tolerance = tighter) for two dtypes."""
    a, b = tolerance_for(table, dt), tolerance_for(table, dr)
    return max(a, b), min(a, b)


def grade(err: float | None, tol: float, strict: float) -> str:
    """The status of an error against the pair tolerance and the strict one."""
    if err is None:
        return "incomparable"
    if not math.isfinite(err) or err > tol:
        return "mismatch"
    if err > strict:
        return "drift"
    return "match"
