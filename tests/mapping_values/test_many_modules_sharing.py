"""Many modules (issue 28, item 4): what the loader and the namer keep once per module is shared by
every call's entry, and what they remember per path or family never leaks from one side's naming
into another's."""
from __future__ import annotations

import json

from dumpcompare.loaders import load_path
from dumpcompare.naming import Namer, load_profiles, name_side
from dumpcompare.records import Dump, Entry, Leaf


def _item(shape: list[int], value: float) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape,
            "Max": value, "Min": -value, "Mean": 0.0, "Norm": 2 * value, "requires_grad": False}


def test_calls_that_do_not_fold_share_names_dtypes_and_shapes(tmp_path):
    # Shapes alternate from call to call (as a generation's or a varying batch's do): no call folds,
    # and every call is an entry of its own.
    data = {}
    for call in range(4):
        seq = 8 if call % 2 == 0 else 9
        data[f"Module.model.layers.0.mlp.down_proj.Linear.forward.{call}"] = {
            "input_args": [_item([1, seq, 16], 1.0 + call)], "input_kwargs": {},
            "output": [_item([1, seq, 8], 2.0 + call)],
            "parameters": {"weight": _item([8, 16], 0.5)}}
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L0", "data": data}))
    dump = load_path(path)
    assert [e.call for e in dump.entries] == [0, 1, 2, 3]
    first, third = dump.entries[0], dump.entries[2]
    assert first.raw_path is third.raw_path and first.cls is third.cls
    for a, b in zip(first.leaves, third.leaves):
        assert a.name is b.name and a.dtype is b.dtype and a.shape is b.shape
    weights = [next(lf for lf in e.leaves if lf.name == "parameters.weight") for e in dump.entries]
    assert all(w.shape is weights[0].shape for w in weights)
    # Shared, not merged: each call keeps its own statistics.
    assert [e.leaves[0].max for e in dump.entries] == [1.0, 2.0, 3.0, 4.0]


def _layer(names: list[str]) -> Dump:
    entries = [Entry(f"Module.model.layers.0.{n}.RMSNorm.forward.0", i, "module", f"model.layers.0.{n}",
                     "RMSNorm", "forward", 0, [Leaf("input_args.0", "torch.float32", (1, 4, 8)),
                                               Leaf("output.0", "torch.float32", (1, 4, 8))])
               for i, n in enumerate(names)]
    return Dump(None, None, "msprobe", "statistics", "L0", "pytorch", None, entries)


def _point(recs, local: str) -> str:
    rec = next(r for r in recs if r.local == local)
    return next(p.point for p in rec.ports if p.leaf == "output.0")


def test_one_namer_names_each_side_by_its_own_layer_roles():
    # The post-attention norm's output is the normed attention output in a layer with a
    # pre-feedforward norm (Gemma 2/3), the MLP's input otherwise: the answer depends on the side's
    # other modules, so what the namer remembered for one side must not answer for the next.
    namer = Namer(load_profiles())
    _, gemma = name_side(_layer(["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm"]),
                         "train", namer, "hf")
    _, llama = name_side(_layer(["input_layernorm", "post_attention_layernorm"]), "rollout", namer, "hf")
    _, gemma_again = name_side(_layer(["input_layernorm", "post_attention_layernorm",
                                       "pre_feedforward_layernorm"]), "train", namer, "hf")
    assert _point(gemma, "post_attention_layernorm") == "L0.attn_out_normed"
    assert _point(llama, "post_attention_layernorm") == "L0.mlp_norm_out"
    assert _point(gemma_again, "post_attention_layernorm") == "L0.attn_out_normed"


def test_result_sides_share_the_lists_they_hold_alike(tmp_path):
    # A module's parameter and output comparisons name the same module; most sides hold one dtype:
    # one list each, not a copy per comparison (21.7k comparisons over many modules held 20 MB).
    from pathlib import Path

    from dumpcompare import cli
    pair = Path(__file__).resolve().parents[2] / "examples" / "hf_train_vs_vllm_rollout"
    args = cli.build_parser().parse_args(["--train", str(pair / "train"), "--rollout", str(pair / "rollout"),
                                          "--out-dir", str(tmp_path), "--quiet"])
    setup = cli._setup(args)
    results = cli._compare(args, setup, cli._load(args, setup)).results
    by_module: dict[str, list] = {}
    for r in results:
        if len(r.train["modules"]) == 1:
            by_module.setdefault(r.train["modules"][0], []).append(r)
    a, b = next(rs[:2] for rs in by_module.values() if len(rs) > 1)
    assert a.train["modules"] is b.train["modules"] and a.train["modules"] == [a.train["modules"][0]]
    float32 = [r.train["dtypes"] for r in results if r.train["dtypes"] == ["torch.float32"]]
    assert len(float32) > 10 and all(d is float32[0] for d in float32)


def test_later_calls_point_names_are_one_copy_across_ports_and_sides(tmp_path):
    # A producer's output and its consumer's input name one point, and so does the other side's
    # port: made per port, 56k names of 21k distinct ones over many modules; one copy each is kept.
    import sys
    from pathlib import Path

    from dumpcompare import cli
    tools = Path(__file__).resolve().parents[2] / "tools"
    sys.path.insert(0, str(tools))
    try:
        import manydump
    finally:
        sys.path.remove(str(tools))
    manydump.write_pair(tmp_path / "pair", calls=3, layers=2)
    args = cli.build_parser().parse_args(["--train", str(tmp_path / "pair" / "train"), "--rollout",
                                          str(tmp_path / "pair" / "rollout"), "--out-dir", str(tmp_path / "out"),
                                          "--quiet"])
    setup = cli._setup(args)
    recs = cli._load(args, setup).recs
    later = [p.point for s in ("train", "rollout") for r in recs[s] if r.call for p in r.ports]
    by_value: dict[str, list[str]] = {}
    for point in later:
        by_value.setdefault(point, []).append(point)
    assert "L0.resid_out@1" in by_value and len(by_value["L0.resid_out@1"]) >= 3
    assert all(x is copies[0] for copies in by_value.values() for x in copies)
    # The train side's name of call 1's residual stream is the very object the rollout side holds.
    held = {s: [p.point for r in recs[s] if r.call == 1 for p in r.ports if p.point == "L0.resid_out@1"]
            for s in ("train", "rollout")}
    assert held["train"] and held["rollout"] and held["train"][0] is held["rollout"][0]
