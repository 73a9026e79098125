"""A saved mapping plan (output_2_mapping.json) read back onto the records of two dumps.

``run_compare.py --plan`` executes such a plan instead of naming and mapping again: the plan
refers to modules by their dump keys (output_2 ``train_keys``, ``key``, comparison ``key``), never
by list position, so it fits the dumps it was made from, and any dump holding those entries. A key
the dumps do not hold, or a record the plan cannot be read from, is an InputError naming the file.
"""
from __future__ import annotations

import json
from pathlib import Path

from .containment import kind
from .errors import InputError
from .plan import Carrier, MappingPlan, OneSided, Pair, PointPlan
from .naming import ModuleRecord

SIDES = ("train", "rollout")
_MAJOR = "2"     # the output_2 layout this module reads (output_schemas.md)


class _Keys:
    """Dump key -> record index per side; a key the side does not hold is an InputError."""

    def __init__(self, path: Path, recs: dict[str, list[ModuleRecord]]):
        self.path, self.recs = path, recs
        self.index = {s: {} for s in SIDES}
        for s in SIDES:
            for r in recs[s]:
                self.index[s].setdefault(r.key, r.index)

    def __call__(self, side: str, key: str) -> int:
        i = self.index[side].get(key)
        if i is None:
            raise InputError(f"{self.path}: the plan names {side} module key {key!r}, which the {side} dump "
                             "does not hold (a plan saved from other dumps?)")
        return i

    def carrier(self, side: str, held: dict) -> Carrier:
        i = self(side, held["key"])
        io = next((p.io for p in self.recs[side][i].ports if p.leaf == held["leaf"]), None)
        if io is None:
            raise InputError(f"{self.path}: the plan reads leaf {held['leaf']!r} of {side} module key "
                             f"{held['key']!r}, which that entry does not hold")
        return Carrier(i, held["leaf"], io)


def read(path: str | Path) -> dict:
    """The saved plan document (checked before the dumps are read, so a wrong file fails fast)."""
    path = Path(path)
    what = kind(path)
    if what != "file":
        raise InputError(f"{path}: --plan is {'missing' if what == 'missing' else 'a ' + what}, not a JSON file")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: --plan is not a readable JSON file ({exc})") from None
    except RecursionError:
        raise InputError(f"{path}: --plan is not a mapping plan (nested too deeply)") from None
    if not isinstance(doc, dict) or str(doc.get("schema_version", "")).split(".")[0] != _MAJOR:
        raise InputError(f"{path}: --plan needs an output_2_mapping.json of schema_version {_MAJOR}.x")
    return doc


def resolve(doc: dict, path: str | Path, recs: dict[str, list[ModuleRecord]]) -> MappingPlan:
    """The plan ``doc`` (read from ``path``) with its modules found by key in ``recs`` (per side)."""
    path = Path(path)
    keys = _Keys(path, recs)
    try:
        plan = _plan(doc, keys)
    except (KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{path}: not a mapping plan (a record lacks or misstates {exc})") from None
    pids = {p.pid for p in plan.pairs}
    named = ({o.before_pair for o in plan.one_sided} | {o.after_pair for o in plan.one_sided}
             | {c.pair for c in plan.comparisons}) - {None}
    if named - pids:
        raise InputError(f"{path}: the plan refers to pairs it does not define: {', '.join(sorted(named - pids))}")
    return plan


def _plan(doc: dict, keys: _Keys) -> MappingPlan:
    pairs = [Pair(p["pair_id"], p["kind"], [keys("train", k) for k in p["train_keys"]],
                  [keys("rollout", k) for k in p["rollout_keys"]], p["layer"], p["block"], p["role"], p["note"],
                  {io: list(p["points"][io]) for io in ("in", "out", "param")}, p["aligned_by"]) for p in doc["pairs"]]
    one_sided = [OneSided(o["side"], keys(o["side"], o["key"]), o["expected"], o["reason"], o["activation_like"],
                          o["before_pair"], o["after_pair"], o["pass_through"]) for o in doc["one_sided"]]
    comparisons = [PointPlan(c["cid"], c["point"], c["kind"], c["axis"],
                             [keys.carrier("train", x) for x in c["train"]],
                             [keys.carrier("rollout", x) for x in c["rollout"]],
                             c["train_layout"], c["rollout_layout"], c["pair"], c["stitched"],
                             [(h["what"], h["side"], keys.carrier(h["side"], h)) for h in c["heads"]])
                   for c in doc["comparisons"]]
    unmatched = {s: list(doc["unmatched_points"][s]) for s in SIDES}
    return MappingPlan(pairs, one_sided, comparisons, unmatched)
