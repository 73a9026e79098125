"""SGLang dumper folders (tests/data/real_sglang, written by the dumper itself): loading, naming of
leaves, statistics, ranks, steps, dims annotations, and bad input."""
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dumpcompare.cli import main as cli_main
from dumpcompare.loaders import load_path
from dumpcompare.loaders.inputs import plan_inputs, survey
from dumpcompare.loaders import dims as D
from dumpcompare.loaders.sglang_dumper import (CORE_FIELDS, find_parts, load_part, parse_name, parts_of,
                                               recorded_family, split_non_intrusive, token_signature)
from dumpcompare.errors import InputError
from dumpcompare.naming import ModuleRecord
from dumpcompare.records import Leaf
from dumpcompare.tensorio import TensorInfo, TensorReadError, load_pt_tree, open_tensor
from synth.ptfile import load_tensor
from synth.tp import merge_rule

DATA = Path(__file__).resolve().parents[1] / "data" / "real_sglang"


@pytest.fixture
def run(capsys, tmp_path):
    """The compare CLI in this process -> (exit code, stdout, stderr, output folder)."""
    def go(*args):
        out = tmp_path / "out"
        rc = cli_main([str(a) for a in args] + ["--out-dir", str(out)])
        cap = capsys.readouterr()
        return SimpleNamespace(rc=rc, out=cap.out, err=cap.err, dir=out)
    return go


def _part(side, kind="dumper", rank="0"):
    return next(p for p in find_parts(DATA / kind / side) if p.rank == rank)


def _leaves(dump):
    return {(e.raw_path, lf.name): lf for e in dump.entries if e.kind == "module" and e.direction == "forward"
            for lf in e.leaves if lf.is_tensor}


def test_parts_are_one_per_step_and_rank():
    assert [(p.step, p.rank, len(p.files)) for p in find_parts(DATA / "dumper" / "train")] == [("0", "0", 103)]
    assert [(p.step, p.rank) for p in find_parts(DATA / "dumper" / "rollout")] == [("0", "0"), ("0", "1")]
    assert [(p.step, p.rank) for p in find_parts(DATA / "old")] == [("1", "0"), ("2", "0")]
    assert [(f.step, f.rank, type(f.path).__name__) for f in survey(str(DATA / "dumper" / "rollout"), "rollout")] == [
        ("0", "0", "DumperPart"), ("0", "1", "DumperPart")]
    assert [type(f.path).__name__ for f in survey(str(DATA / "msprobe" / "train"), "train")] == ["PosixPath"]


def test_names_and_statistics_match_msprobe_of_the_same_run():
    """Every leaf msprobe recorded for the HF train run is found under the same module path and
    leaf name in the dumper's dump, with the same statistics (computed here from the tensors)."""
    dumper = _leaves(load_part(_part("train")))
    probe = _leaves(load_path(next((DATA / "msprobe" / "train").rglob("dump.json"))))
    shared = [k for k in probe if k in dumper]
    # Only what the dumper writes elsewhere or not at all is missing: keyword inputs that are its
    # core fields (written bare, as batch metadata) and the fields of ModelOutput objects.
    missing = [k for k in probe if k not in dumper]
    assert all(leaf.split(".")[-1] in CORE_FIELDS or leaf.startswith("output.0.") for _, leaf in missing), missing
    assert len(shared) > 90 and len(missing) < 10
    for k in shared:
        a, b = dumper[k], probe[k]
        assert a.shape == b.shape and a.dtype == b.dtype, k
        for attr in ("max", "min", "mean", "norm"):
            x, y = getattr(a, attr), getattr(b, attr)
            assert (x is None) == (y is None), (k, attr)
            if x is not None:
                assert x == pytest.approx(y, rel=1e-4, abs=1e-6), (k, attr)
    assert ("model.layers.1.mlp.down_proj", "parameters.weight") in shared
    assert ("model.layers.0.self_attn", "input_kwargs.hidden_states") in shared


def test_statistics_are_those_of_the_tensor_file():
    dump = load_part(_part("rollout", rank="1"))
    lf = _leaves(dump)[("model.layers.0.self_attn.qkv_proj", "output.0")]
    arr = load_tensor(dump.dump_dir / lf.data_name).astype(np.float64)
    assert lf.shape == arr.shape == (8, 32)     # (q 16 + k 8 + v 8) on one of 2 ranks
    assert (lf.max, lf.min) == (arr.max(), arr.min())
    assert lf.mean == pytest.approx(arr.mean()) and lf.norm == pytest.approx(np.linalg.norm(arr))
    ids = _leaves(dump)[("model.embed_tokens", "input_args.0")]
    assert ids.dtype == "torch.int64" and (ids.max, ids.min, ids.mean, ids.norm) == (11, 1, None, None)


def test_core_fields_and_parameters():
    dump = load_part(_part("train"))
    api = [e.raw_path for e in dump.entries if e.kind == "api"]
    # token ids and positions the dumper writes bare (not one module's tensor) are listed, not compared
    assert "input_ids" in api and "layers.0.position_ids" in api
    down = next(e for e in dump.entries if e.raw_path == "model.layers.1.mlp.down_proj")
    assert [lf.name for lf in down.leaves] == ["input_args.0", "output.0", "parameters.weight"]
    assert down.n_args == 1 and down.key == "Module.model.layers.1.mlp.down_proj.Module.forward.0"
    # completion order: a module comes after its children, as msprobe writes it
    order = [e.raw_path for e in dump.entries if e.kind == "module"]
    assert order.index("model.layers.0.mlp.down_proj") < order.index("model.layers.0.mlp") \
        < order.index("model.layers.0") < order.index("model.layers.1.input_layernorm")


def test_rollout_ranks_merge_and_fault_found_in_tensor_mode(run):
    res = run("--train", DATA / "dumper" / "train", "--rollout", DATA / "dumper" / "rollout", "--rollout-rank", "all")
    assert res.rc == 0, res.err
    doc3 = json.loads((res.dir / "output_3_value_compare.json").read_text())
    doc4 = json.loads((res.dir / "output_4_module_analysis.json").read_text())
    assert doc3["mode"] == "tensor"
    fd = doc4["first_divergence"]
    assert fd["train_modules"] == fd["rollout_modules"] == ["model.layers.1.mlp.down_proj"]
    assert fd["point"] == "L1.down.weight"
    qkv = next(r for r in doc3["results"] if r["point"] == "L0.q+L0.k+L0.v")
    assert qkv["rollout"]["merges"] == ["concat:1"] and qkv["status"] == "match"
    assert "vllm" in res.out.split("rollout:")[1].splitlines()[0]   # detected without class names


def test_the_ranks_of_a_step_merge_by_default(run):
    res = run("--train", DATA / "dumper" / "train", "--rollout", DATA / "dumper" / "rollout")
    assert res.rc == 0, res.err
    src = json.loads((res.dir / "output_1_key_mapping.json").read_text())["sources"]["rollout"]
    assert (src["ranks"], src["rank_layout"]["kind"]) == (["0", "1"], "tensor_parallel")
    first = json.loads((res.dir / "output_4_module_analysis.json").read_text())["first_divergence"]
    assert first["rollout_modules"] == ["model.layers.1.mlp.down_proj"]


def test_hand_named_dumps_map_by_name_and_layer_with_dims(run):
    res = run("--train", DATA / "named" / "train", "--rollout", DATA / "named" / "rollout", "--rollout-rank", "all")
    assert res.rc == 0, res.err
    doc3 = json.loads((res.dir / "output_3_value_compare.json").read_text())
    doc4 = json.loads((res.dir / "output_4_module_analysis.json").read_text())
    by_point = {r["point"]: r for r in doc3["results"]}
    assert set(by_point) == {f"path:layers.{i}.{n}:output.0" for i in (0, 1)
                             for n in ("layer_start__hidden_states", "attn_core_output", "mlp_output")} \
        | {"path:final_norm__hidden_states:output.0"}
    heads = by_point["path:layers.0.attn_core_output:output.0"]
    # dims "t (num_heads*head_dim)[tp]": the two ranks' heads are joined along dim 1
    assert heads["rollout"]["merges"] == ["concat:1"] and heads["status"] == "match"
    # dims "b s h" vs "t h": [1, 8, 32] and [8, 32] are laid out as tokens, not flattened
    start = by_point["path:layers.1.layer_start__hidden_states:output.0"]
    assert start["status"] == "match" and not any("flattened" in n for n in start["notes"])
    assert doc4["first_divergence"]["train_modules"] == ["layers.1.mlp_output"]


def test_prefill_and_decode_steps_join_into_one_generation(run):
    """A rollout dumped with one dumper step per engine forward: its prefill and decode steps,
    found by the tokens they saw (or pinned as a range) and joined, compare with the train's single
    forward over the same tokens."""
    res = run("--train", DATA / "gen" / "train", "--rollout", DATA / "gen" / "rollout")
    assert res.rc == 0, res.err
    doc1 = json.loads((res.dir / "output_1_key_mapping.json").read_text())
    assert any(n.startswith("rollout steps 0, 1, 2 joined: together they saw the same tokens")
               for n in doc1["sources"]["rollout"]["notes"])
    doc3 = json.loads((res.dir / "output_3_value_compare.json").read_text())
    doc4 = json.loads((res.dir / "output_4_module_analysis.json").read_text())
    assert "steps 0, 1, 2 joined as calls 0..2 of each module" in doc1["sources"]["rollout"]["notes"]
    tokens = next(r for r in doc3["results"] if r["point"] == "M.tokens")
    assert tokens["rollout"]["shapes"] == [[8], [1], [1]] and tokens["train"]["shapes"] == [[1, 10]]
    assert tokens["status"] == "match" and "rollout calls 0..2 stitched along the tokens" in tokens["notes"]
    fd = doc4["first_divergence"]
    assert fd["rollout_modules"] == ["model.layers.1.mlp.down_proj"] and fd["point"] == "L1.mlp_out"
    bad = next(r for r in doc3["results"] if r["point"] == "L1.mlp_out")
    assert bad["status"] == "mismatch" and bad["tensor_metrics"]["first_token_past_tol"] == 0


def test_token_signatures_of_parts():
    # the prompt (ids 1..11) and its positions 0..7, from the root model's inputs
    assert token_signature(_part("rollout")) == (8, 11, 1, 0)
    prefill, *decodes = find_parts(DATA / "gen" / "rollout")
    assert token_signature(prefill) == (8, 11, 1, None)   # filtered dump: the embedding's ids only
    train = find_parts(DATA / "gen" / "train")[0]
    assert token_signature(train)[:3] == (10, 46, 1)
    assert [token_signature(d)[:3] for d in decodes] == [(1, 45, 45), (1, 46, 46)]


# The naming file of input_formats.md ("SGLang dumper folders"): hand-named dumps given the roles
# of the modules whose tensors they hold.
NAMED_YAML = """
roles:
  - {role: mlp, block: mlp, local: ['mlp_output']}
  - {role: attn_core, block: attention, local: ['attn_core_output']}
  - {role: final_norm, block: norm, model: ['final_norm__hidden_states']}
  - {role: stream_in, block: layer, local: ['layer_start__hidden_states']}
ports:
  hf:
    stream_in: [{map: {output.0: 'in:{L}.resid_in'}}]
expected_one_sided:
  - {role: stream_in, reason: "a hand-named dump of the stream entering a layer, compared as L<n>.resid_in"}
"""


def test_hand_named_dumps_against_module_dumps_with_a_naming_file(run, tmp_path):
    naming = tmp_path / "named.yaml"
    naming.write_text(NAMED_YAML)
    res = run("--train", DATA / "named" / "train", "--rollout", DATA / "dumper" / "rollout", "--rollout-rank", "all",
              "--naming", naming)
    assert res.rc == 0, res.err
    doc3 = json.loads((res.dir / "output_3_value_compare.json").read_text())
    doc4 = json.loads((res.dir / "output_4_module_analysis.json").read_text())
    by_point = {r["point"]: r for r in doc3["results"] if r["pair"] is None}
    assert by_point["L0.resid_out"]["train"]["modules"] == ["layers.1.layer_start__hidden_states"]
    assert by_point["L0.resid_out"]["rollout"]["modules"] == ["model.layers.1.input_layernorm"]
    assert by_point["L0.resid_out"]["status"] == by_point["L1.attn_core_out"]["status"] == "match"
    assert by_point["L1.mlp_out"]["status"] == "mismatch"
    fd = doc4["first_divergence"]
    assert (fd["train_modules"], fd["rollout_modules"], fd["point"]) == (
        ["layers.1.mlp_output"], ["model.layers.1.mlp"], "L1.mlp_out")


def test_old_dumper_bare_tensors_and_step_chains(run):
    # hand-named layer outputs show no token ids to pair the steps by: the user chooses
    res = run("--train", DATA / "old", "--rollout", DATA / "old")
    assert res.rc == 2 and "step1: tokens (numel, max, min) None" in res.err and "--train-step" in res.err
    found = {s: survey(str(DATA / "old"), s) for s in ("train", "rollout")}
    plan = plan_inputs({"train": "T", "rollout": "R"}, {"train": "1", "rollout": "1-2"},
                       {"train": None, "rollout": None}, found)
    assert [[f.path.step for f in st.files] for st in plan.rollout.steps] == [["1"], ["2"]]
    dump = load_part(plan.rollout.steps[0].files[0].path)
    assert [(e.raw_path, [lf.shape for lf in e.leaves]) for e in dump.entries] == [
        ("layers.0.mlp_output", [(1, 8, 32)]), ("layers.1.mlp_output", [(1, 8, 32)])]
    res = run("--train", DATA / "old", "--train-step", "1", "--rollout", DATA / "old", "--rollout-step", "step1")
    assert res.rc == 0, res.err


@pytest.mark.parametrize("case, words", [
    ("not_a_record", ["not an SGLang dumper file", "holds a dict"]),
    ("hostile", ["not an SGLang dumper file", "refused pickle global posix.system"]),
    ("path_name", ["'../../outside/x'", "path separator"]),
])
def test_bad_files_exit_2_with_one_line(run, case, words):
    res = run("--train", DATA / "bad" / case, "--rollout", DATA / "dumper" / "train")
    assert res.rc == 2 and res.out == "" and not res.dir.exists()
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {DATA / 'bad' / case}/step=0"), res.err
    assert all(w in lines[0] for w in words), lines[0]


def test_unfinished_file_is_skipped_with_a_note():
    dump = load_part(find_parts(DATA / "bad" / "unfinished")[0])
    assert [e.raw_path for e in dump.entries] == ["layers.0.hidden"]
    assert any("could not finish writing" in n and "state" in n for n in dump.notes)


def test_recomputed_forward_is_skipped_with_a_note():
    dump = load_part(find_parts(DATA / "bad" / "recompute")[0])
    assert [(e.raw_path, e.call) for e in dump.entries] == [("layers.0.hidden", 0)]
    assert dump.entries[0].leaves[0].max == 5.0       # the original forward's value, not the doubled one
    assert any(n.startswith("1 dumps of recomputed forwards skipped") for n in dump.notes)


@pytest.mark.parametrize("meta, family", [
    ({"sglang_parallel_info": {"tp_rank": 0, "tp_size": 2}}, "sglang"),
    ({"sglang_parallel_info": {"tp_rank": 0, "dp_attention_error": True}}, None),
    ({"megatron_parallel_info": {"tp_rank": 1, "tp_size": 2}}, "megatron"),
    ({"megatron_parallel_info": {"megatron_error": True}}, None),    # importable, not running
    ({}, None),
])
def test_family_recorded_by_the_dumper(meta, family):
    assert recorded_family(meta) == family


def test_format_option(run, tmp_path):
    res = run("--train", DATA / "msprobe" / "train", "--rollout", DATA / "msprobe" / "train", "--format", "sglang")
    assert res.rc == 2 and "no SGLang dumper file" in res.err
    res = run("--train", DATA / "dumper" / "train", "--rollout", DATA / "dumper" / "train", "--format", "msprobe")
    assert res.rc == 2 and "no dump.json" in res.err
    stray = tmp_path / "stray"
    stray.mkdir()
    shutil.copy(next((DATA / "bad" / "not_a_record").glob("*.pt")), stray / "weights.pt")
    with pytest.raises(InputError, match="no dump.json"):    # a .pt file not named by the dumper:
        survey(str(stray), "train")                            # not a dumper folder
    with pytest.raises(InputError, match="no SGLang dumper file"):
        parts_of(str(stray), "train")


@pytest.mark.parametrize("name, expected", [
    ("model.layers.0.mlp.inputs.0", ("model.layers.0.mlp", "input_args.0")),
    ("model.layers.0.self_attn.inputs.hidden_states", ("model.layers.0.self_attn", "input_kwargs.hidden_states")),
    ("model.layers.0.self_attn.inputs.position_embeddings.1", ("model.layers.0.self_attn",
                                                                "input_kwargs.position_embeddings.1")),
    ("model.layers.0.output", ("model.layers.0", "output.0")),
    ("model.layers.0.mlp.gate_up_proj.output.1", ("model.layers.0.mlp.gate_up_proj", "output.1")),
    ("encoder.layer.0.output.output", ("encoder.layer.0.output", "output.0")),   # a module named output
    ("encoder.layer.0.output.dense.inputs.0", ("encoder.layer.0.output.dense", "input_args.0")),
    ("inputs.0", ("", "input_args.0")),                                           # the root model
    ("output", ("", "output.0")),
    ("model.layers.0.mlp", None),
])
def test_split_non_intrusive(name, expected):
    assert split_non_intrusive(name) == expected


def test_pt_tree_reader():
    """load_pt_tree returns a record's plain meta with tensors as TensorInfo; open_tensor reads a
    record's value; anything holding other objects is refused with the reason."""
    record = next((DATA / "dumper" / "train").glob("*name=non_intrusive__model.norm.output*"))
    tree = load_pt_tree(record)
    assert tree["value"] == TensorInfo("float32", (1, 8, 32))
    assert tree["meta"]["name"] == "non_intrusive__model.norm.output" and tree["meta"]["world_size"] == 1
    assert tree["meta"]["megatron_parallel_info"] == {"megatron_error": True}
    arr, raw = open_tensor(record)
    assert arr.shape == (1, 8, 32) and not raw
    hostile = next((DATA / "bad" / "hostile").glob("*.pt"))
    with pytest.raises(TensorReadError, match="refused pickle global posix.system"):
        load_pt_tree(hostile)
    with pytest.raises(TensorReadError, match="refused pickle global posix.system"):
        load_tensor(hostile)
    pt = DATA.parent / "pt"
    assert isinstance(load_pt_tree(pt / "state_dict.pt"), dict)


def test_parse_name():
    f = parse_name(Path("step=3___rank=1___dump_index=12___name=a.b___recompute_status=disabled___layer_id=2.pt"))
    assert (f.step, f.rank, f.index, f.name) == ("3", "1", 12, "a.b")
    assert parse_name(Path("forward_pass_id=1___rank=0___name=x___dump_index=4.pt")).step == "1"
    for bad in ("weights.pt", "step=0___rank=0___name=x.pt", "step=0___rank=r___dump_index=1___name=x.pt",
                "step=0___rank=0___dump_index=1___name=x.npy"):
        assert parse_name(Path(bad)) is None, bad


@pytest.mark.parametrize("text, layout, rule", [
    ("t h[tp]", "t", "concat:1"),
    ("b s h", "bs", None),
    ("s b h[tp:partial]", "sb", "sum"),
    ("t (num_heads*head_dim)[tp]", "t", "concat:1"),
    ("t[sp] h", "t", "concat:0"),
    ("t h # tp:replicated", "t", "replicated"),
    ("t h[tp,cp]", "t", None),            # two sharded axes: no single rule
    ("t[cp:zigzag] h", "t", None),        # context parallel: not merged here
    ("h[tp] d", None, "concat:0"),
    ("t h[", None, None),
    (None, None, None),
])
def test_dims(text, layout, rule):
    assert D.layout(text) == layout and D.shard_rule(text) == rule


def test_declared_shard_rule_wins_over_the_guess():
    rec = ModuleRecord("rollout", 0, "k", "module", "forward", "m", "m", "Module", 0, 0, "x", None, "other", "hf")
    same = [Leaf("output.0", "torch.float32", (8, 16), 1.0, 0.0, 0.5, 2.0) for _ in range(2)]
    assert merge_rule(rec, "output.0", same, {}) == "replicated"
    hinted = [Leaf("output.0", "torch.float32", (8, 16), 1.0, 0.0, 0.5, 2.0, shard_hint="concat:0") for _ in range(2)]
    assert merge_rule(rec, "output.0", hinted, {}) == "concat:0"
