"""The side decision has one owner, rootcause/sides.py: no other module of the root-cause package
writes a finding's ``side`` or ``side_reason`` (read from the source with ``ast``), and the side it
takes from the reference forward is the one the compare skill publishes in output_4
``reference_forward.verdict``, read from there."""
from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from dumpcompare import refforward
from rootcause import sides

PACKAGE = Path(__file__).resolve().parents[2] / "rl-consistency-analysis" / "scripts" / "rootcause"
OWNED = {"side", "side_reason"}
VALUES = {sides.TRAIN, sides.ROLLOUT, sides.BOTH, sides.NEITHER, sides.UNDETERMINED}


def _writes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, how) of every write of an owned key: ``x["side"] = ...``, ``x.update(side=...)`` and a
    dict display whose ``"side"`` is one of the side values (a record naming a side by its own
    field, such as ``{"side": o["side"]}`` of a one-sided module, is not a decision)."""
    out = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for sub in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) \
                        and sub.slice.value in OWNED:
                    out.append((node.lineno, f"assigns [{sub.slice.value!r}]"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "update", "setdefault"):
            out += [(node.lineno, f"{node.func.attr}({k.arg}=...)") for k in node.keywords if k.arg in OWNED]
            if node.func.attr == "setdefault" and node.args and isinstance(node.args[0], ast.Constant) \
                    and node.args[0].value in OWNED:
                out.append((node.lineno, "setdefault"))
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "side" and isinstance(v, ast.Constant) \
                        and v.value in VALUES:
                    out.append((node.lineno, f"dict with side {v.value!r}"))
    return out


def test_only_sides_writes_a_findings_side():
    found = []
    for f in sorted(PACKAGE.glob("*.py")):
        if f.name == "sides.py":
            continue
        found += [f"{f.name}:{line}: {how}" for line, how in _writes(ast.parse(f.read_text(encoding="utf-8")))]
    assert not found, "a finding's side is decided outside sides.py:\n" + "\n".join(found)


def test_the_search_sees_each_kind_of_write():
    src = ('f["side"] = "both"\nf.update(side="train")\ng = {"side": "undetermined"}\n'
           'f["side_reason"] += "x"\nok = {"side": o["side"]}\n'
           'f["train_module" if op["side"] == "train" else "rollout_module"] = None\n')
    assert sorted(line for line, _ in _writes(ast.parse(src))) == [1, 2, 3, 4]


def _side(departure_point: str | None, layer: int | None = 0, points: int = 7) -> dict:
    dep = {"point": departure_point, "layer": layer} if departure_point else None
    return {"ran": True, "points": points, "matching": points - (1 if dep else 0), "departure": dep}


CASES = {
    "train departs": {"train": _side("L0.mlp.out"), "rollout": _side(None)},
    "rollout departs": {"train": _side(None), "rollout": _side("L1.attn.out", layer=1)},
    "both, other points": {"train": _side("L0.mlp.out"), "rollout": _side("L1.attn.out", layer=1)},
    "both, same point": {"train": _side("L0.mlp.out"), "rollout": _side("L0.mlp.out")},
    "neither departs": {"train": _side(None), "rollout": _side(None)},
    "one side did not run": {"train": _side("L0.mlp.out"), "rollout": {"ran": False, "reason": "no tokens"}},
}


def _forward_record(sides_doc: dict, verdict: dict) -> dict:
    """The reference_forward side_evidence record sides.py builds from an output_4 whose
    ``reference_forward`` holds ``sides_doc`` and ``verdict``, for a finding at layer 5."""
    ev = SimpleNamespace(analysis={"reference_forward": {"ran": True, "sides": sides_doc, "verdict": verdict,
                                                         "hypotheses": []}})
    return sides.forward_evidence(ev, {"layer": 5})


@pytest.mark.parametrize("case", CASES)
def test_forward_side_is_the_published_verdict(case):
    """sides.py takes the side from the compare skill's published verdict (output_4
    ``reference_forward.verdict``); where it names a side a finding can take (train, rollout, both),
    the two agree, reason included, and otherwise no side is drawn."""
    published = refforward.verdict({"sides": CASES[case]})
    side, why = sides.side_from_forward(_forward_record(CASES[case], published))
    if published["side"] in (sides.TRAIN, sides.ROLLOUT, sides.BOTH):
        assert (side, why) == (published["side"], "reference forward: " + published["reason"])
    else:
        assert (side, why) == (None, None)


def test_forward_side_follows_an_edited_verdict():
    """The departures alone no longer decide: an output_4 verdict that names the other side, or
    that is withheld (a checkpoint that fits neither side), is what the root-cause step reads."""
    departs = CASES["train departs"]
    edited = {"side": "rollout", "reason": "an edited reason"}
    assert sides.side_from_forward(_forward_record(departs, edited)) == ("rollout", "reference forward: an edited reason")
    withheld = {"side": "undetermined", "reason": "the checkpoint fits neither side", "checkpoint_fits": False}
    assert sides.side_from_forward(_forward_record(departs, withheld)) == (None, None)
