"""Both sides held against the checkpoint's numpy forward on the real corpus (issue 17).

Statistics-only cases need the prompt's token ids, which a prefill's statistics cannot give: they
are taken from what the tensor-mode case of the same checkpoint dumped (the corpus builds every
case of a checkpoint from one seeded prompt), and passed as the user would, with --token-ids.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from refcheck.realcases import COMPARE, CORPUS, ROOTCAUSE, case, report, run

MEGATRON_MODEL = str(CORPUS / "_models" / "megatron_llama")
PLAIN_QKV = "qkv stored as plain [q; k; v], read as Megatron's per-query-group layout"


def _forward(out) -> dict:
    return json.loads((out / "output_3_value_compare.json").read_text(encoding="utf-8"))["reference_forward"]


def _megatron(name: str, out, *extra: str):
    return run(COMPARE, name, out, "--model", MEGATRON_MODEL, *extra, model=False)


@pytest.fixture(scope="module")
def llama_ids(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("llama_ids")
    assert run(COMPARE, "llama_tp1_tensor_clean", out).returncode == 0
    tok = _forward(out)["tokens"]
    assert tok["train"]["how"] == tok["rollout"]["how"] == "tensor"
    return json.dumps(tok["train"]["ids"])


@pytest.fixture(scope="module")
def megatron_ids(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("megatron_ids")
    assert _megatron("megatron_tp1_tensor_clean", out).returncode == 0
    tok = _forward(out)["tokens"]
    assert tok["train"]["how"] == "tensor" and tok["train"]["ids"] == tok["rollout"]["ids"]
    return json.dumps(tok["train"]["ids"])


def _assert_clean(rf: dict, min_points: int = 40) -> None:
    assert rf["ran"] and rf["verdict"]["side"] == "neither", rf["verdict"]
    for side in ("train", "rollout"):
        s = rf["sides"][side]
        assert s["departure"] is None and s["matches_everywhere"], (side, s)
        assert s["points"] >= min_points
    judged = [j for p in rf["points"].values() for j in p.values() if j["matches_reference"] != "unknown"]
    assert judged and all(j["error"] <= j["tolerance"] for j in judged)


def test_tensor_dump_gives_unique_ids_and_both_sides_match(tmp_path):
    assert run(COMPARE, "llama_tp1_tensor_clean", tmp_path).returncode == 0
    rf = _forward(tmp_path)
    for side in ("train", "rollout"):
        tok = rf["tokens"][side]
        assert tok["unique"] and tok["how"] == "tensor" and len(tok["ids"]) == 8
    _assert_clean(rf)
    assert all(j["how"].startswith("tensor") for p in rf["points"].values() for j in p.values()
               if j["matches_reference"] is True)


@pytest.mark.parametrize("name", ["llama_tp1_fp32_clean", "llama_tp1_bf16_clean", "llama_tp2_fp32_clean"])
def test_clean_statistics_pairs_match_the_reference_within_noise(name, tmp_path, llama_ids):
    assert run(COMPARE, name, tmp_path, "--token-ids", llama_ids).returncode == 0
    rf = _forward(tmp_path)
    assert rf["tokens"]["train"]["how"] == "given" and rf["tokens"]["train"]["unique"]
    _assert_clean(rf)
    if "bf16" in name:
        assert {rf["sides"][s]["forward_dtype"] for s in ("train", "rollout")} == {"bf16"}


@pytest.mark.parametrize("name", ["megatron_tp1_clean", "megatron_tp2_clean"])
def test_clean_megatron_pairs_match_the_reference(name, tmp_path, megatron_ids):
    assert _megatron(name, tmp_path, "--token-ids", megatron_ids).returncode == 0
    _assert_clean(_forward(tmp_path))


def test_prefill_statistics_refuse_to_guess_decode_steps_are_exact(tmp_path, tmp_path_factory):
    ref = tmp_path_factory.mktemp("gen_tensor")
    assert run(COMPARE, "llama_gen_tensor_clean", ref).returncode == 0
    sampled = _forward(ref)["tokens"]["train"]["ids"][8:]
    assert run(COMPARE, "llama_gen_fp32_clean", tmp_path).returncode == 0
    rf = _forward(tmp_path)
    tok = rf["tokens"]["rollout"]
    assert not tok["unique"] and tok["ids"] is None and "--token-ids" in tok["detail"]
    prefill, *steps = tok["calls"]
    assert prefill["tokens"] == 8 and not prefill["unique"] and "order" in prefill["reason"]
    assert [c["how"] for c in steps] == ["input_ids statistics"] * 3
    # The tensor case generated fewer tokens from the same prompt: its sampled ones lead.
    assert sampled and [c["ids"][0] for c in steps][:len(sampled)] == sampled
    assert not rf["ran"] and "token ids not recovered" in rf["sides"]["rollout"]["reason"]
    assert rf["verdict"]["side"] == "undetermined"


def _decode_step_embedding(name: str):
    """The embedding output leaf and the ids leaf of the first decode step of a rollout."""
    from dumpcompare.loaders import load_path

    dump = load_path(CORPUS / name / "rollout" / "step1" / "rank0" / "dump.json")
    entry = next(e for e in dump.entries if e.raw_path.endswith("embed_tokens") and e.direction == "forward")
    leaves = {lf.name: lf for lf in entry.leaves}
    return leaves["output.0"], leaves["input_args.0"]


def test_embedding_row_statistics_name_a_one_token_call_and_refuse_twins():
    from dumpcompare.checkpoint import load
    from dumpcompare.token_ids import recover

    out, ids = _decode_step_embedding("llama_gen_fp32_clean")
    emb = load(CORPUS / "_models" / "llama").read("model.embed_tokens.weight")
    got = recover({"embed": [out]}, None, emb, None, False, 2e-4)
    assert got.unique and got.ids == [int(ids.max)] and got.calls[0]["how"] == "embedding row statistics"
    twin = emb.copy()
    other = (int(ids.max) + 1) % emb.shape[0]
    twin[other] = emb[int(ids.max)]
    got = recover({"embed": [out]}, None, twin, None, False, 2e-4)
    assert not got.unique and got.ids is None and sorted(got.calls[0]["candidates"]) == sorted([int(ids.max), other])


# case -> the candidate that must reproduce the faulty side (None: a weight fault, no candidate)
STATISTICS_FAULTS = {
    "llama_tp1_fp32_stale_rollout": None,
    "llama_tp1_fp32_stale_train": None,
    "llama_tp1_bf16_stale_rollout": None,
    "llama_tp2_fp32_wrong_shard": None,
    "llama_tp1_fp32_norm_eps": "rms_norm_eps = 0.01",
    "llama_tp1_fp32_act_swap": "hidden_act = gelu_pytorch_tanh",
}


@pytest.mark.parametrize("name", sorted(STATISTICS_FAULTS))
def test_statistics_fault_names_its_side_from_the_reference(name, tmp_path, llama_ids):
    c = case(name)
    bad, layer = c["fault"]["side"], c["expected"]["layer"]
    good = "train" if bad == "rollout" else "rollout"
    proc = run(ROOTCAUSE, name, tmp_path, "--token-ids", llama_ids)
    assert proc.returncode == 0, proc.stderr
    doc = report(tmp_path)
    rf = doc["reference_forward"]
    assert rf["verdict"]["side"] == bad, rf["verdict"]
    assert rf["sides"][good]["matches_everywhere"]
    dep = rf["sides"][bad]["departure"]
    assert dep["layer"] == layer and dep["error"] > dep["tolerance"]
    top = doc["root_causes"][0]
    assert top["side"] == bad
    ev = next(e for e in top["side_evidence"] if e["kind"] == "reference_forward")
    assert ev["concerns_finding"] and ev["verdict"]["side"] == bad
    hyp = next(h for h in rf["hypotheses"] if h["side"] == bad)
    want = STATISTICS_FAULTS[name]
    if want is None:
        assert hyp["reproduced_by"] == [] and all(t["residual"] > dep["tolerance"] for t in hyp["candidates"])
    else:
        best = hyp["candidates"][0]
        assert hyp["reproduced_by"][0] == want.replace("gelu_pytorch_tanh", "gelu_tanh")
        assert best["reproduces"] and best["residual"] < dep["tolerance"] / 10
        if want.startswith("rms_norm_eps"):
            assert top["side_reason"].startswith("reference forward:") and want in top["side_reason"]


@pytest.mark.parametrize("name", ["megatron_tp1_qkv_plain_order", "megatron_tp1_tensor_qkv_plain_order"])
def test_megatron_plain_qkv_is_found_by_simulation(name, tmp_path, megatron_ids):
    extra = [] if "tensor" in name else ["--token-ids", megatron_ids]
    assert _megatron(name, tmp_path, *extra).returncode == 0
    rf = _forward(tmp_path)
    assert rf["verdict"]["side"] == "train" and rf["sides"]["rollout"]["matches_everywhere"]
    dep = rf["sides"]["train"]["departure"]
    assert dep["layer"] == 0 and dep["point"] == "L0.q"
    hyp = rf["hypotheses"][0]
    assert hyp["side"] == "train" and hyp["reproduced_by"] == [PLAIN_QKV]
    best, *rest = hyp["candidates"]
    assert best["candidate"] == PLAIN_QKV and best["residual"] < dep["tolerance"] / 100
    assert all(t["residual"] > dep["tolerance"] and not t["reproduces"] for t in rest)


def test_a_checkpoint_the_engines_did_not_run_blames_neither_side(tmp_path):
    # The Megatron cases convert their own checkpoint; _models/llama is another model.
    assert run(COMPARE, "megatron_tp1_tensor_clean", tmp_path, "--model", str(CORPUS / "_models" / "llama"),
               model=False).returncode == 0
    rf = _forward(tmp_path)
    assert rf["ran"] and rf["verdict"]["side"] == "undetermined"
    assert rf["sides"]["train"]["departure"]["point"] == rf["sides"]["rollout"]["departure"]["point"] == "L0.resid_in"


def test_switch_off_wrong_ids_and_unsupported_family(tmp_path, llama_ids):
    name = "llama_tp1_fp32_clean"
    assert run(COMPARE, name, tmp_path / "off", "--no-reference-forward", "--token-ids", llama_ids).returncode == 0
    assert _forward(tmp_path / "off") is None
    short = json.dumps(json.loads(llama_ids)[:5])
    assert run(COMPARE, name, tmp_path / "short", "--token-ids", short).returncode == 0
    rf = _forward(tmp_path / "short")
    assert not rf["ran"] and "holds 5 ids" in rf["tokens"]["train"]["detail"] and "not used" in rf["tokens"]["train"]["detail"]
    bad = run(COMPARE, name, tmp_path / "bad", "--token-ids", "[1, -2]")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--token-ids" in bad.stderr
    alone = run(COMPARE, name, tmp_path / "bad", "--reference-forward", model=False)
    assert alone.returncode == 2 and "--reference-forward needs --model" in alone.stderr
    own = tmp_path / "model"
    shutil.copytree(CORPUS / "_models" / "llama", own)
    cfg = json.loads((own / "config.json").read_text())
    (own / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt_neox", "architectures": ["X"]}))
    assert run(COMPARE, name, tmp_path / "unsupported", "--model", str(own), "--token-ids", llama_ids,
               model=False).returncode == 0
    rf = _forward(tmp_path / "unsupported")
    assert not rf["ran"] and "gpt_neox" in rf["reason"] and rf["family"] is None
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())


def test_report_draws_the_three_lines(tmp_path, megatron_ids):
    assert _megatron("megatron_tp1_qkv_plain_order", tmp_path, "--token-ids", megatron_ids).returncode == 0
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    section = html[html.index("Reference forward: each side"):]
    for cls in ("ref-line pair", "ref-line train", "ref-line rollout"):
        assert section.count(f'class="{cls}"') == 1
    assert "departs at L0.q" in section and "reproduced by qkv stored as plain" in section
    assert np.isfinite(_forward(tmp_path)["sides"]["train"]["departure"]["error"])


@pytest.mark.parametrize("name", ["llama_gen_tp2_fp32_stale_rollout", "sglang_llama_gen_fp32_stale_rollout",
                                  "llama_gen_fp32_clean"])
def test_the_prompt_alone_recovers_a_generation(name, tmp_path, llama_ids):
    # The user knows the prompt; the decode steps name the sampled tokens (ids statistics), and
    # the train forward of prompt + sampled tokens takes them from the rollout.
    proc = run(COMPARE, name, tmp_path, "--token-ids", llama_ids)
    assert proc.returncode == 0, proc.stderr
    rf = _forward(tmp_path)
    roll, train = rf["tokens"]["rollout"], rf["tokens"]["train"]
    assert roll["unique"] and [c["how"] for c in roll["calls"]] == ["given"] + ["input_ids statistics"] * 3
    assert train["how"] == "other side" and train["ids"] == roll["ids"] and len(roll["ids"]) == 11
    bad = (case(name)["fault"] or {}).get("side")
    if bad is None:
        _assert_clean(rf, 25)
        assert rf["sides"]["rollout"]["points"] == rf["sides"]["rollout"]["matching"]   # last-token logits too
    else:
        assert rf["verdict"]["side"] == bad and rf["sides"]["train"]["matches_everywhere"]
        assert rf["sides"][bad]["departure"]["layer"] == case(name)["expected"]["layer"]


def test_verdict_table():
    from dumpcompare.refforward import verdict

    def doc(train, rollout):
        side = lambda d: {"ran": True, "points": 9, "departure": d and {"point": d, "layer": int(d[1])}}  # noqa: E731
        return {"sides": {"train": side(train), "rollout": side(rollout)}}
    assert verdict(doc(None, None))["side"] == "neither"
    assert verdict(doc("L1.mlp_out", None))["side"] == "train"
    assert verdict(doc(None, "L0.q"))["side"] == "rollout"
    both = verdict(doc("L1.mlp_out", "L0.q"))
    assert both["side"] == "both" and both["first"] == "rollout"
    assert verdict(doc("L0.resid_in", "L0.resid_in"))["side"] == "undetermined"
    assert verdict({"sides": {"train": {"ran": False}}})["side"] == "undetermined"


def test_a_stale_weight_dumped_as_a_tensor_reproduces_its_side(tmp_path):
    assert run(COMPARE, "llama_tp1_tensor_stale_rollout", tmp_path).returncode == 0
    rf = _forward(tmp_path)
    hyp = rf["hypotheses"][0]
    dep = rf["sides"]["rollout"]["departure"]
    assert hyp["side"] == "rollout" and dep["point"] == "L1.mlp_out" and dep["how"] == "tensor"
    best, *rest = hyp["candidates"]
    assert hyp["reproduced_by"] == [best["candidate"]] == ["the rollout side's own L1.down.weight (differs from the checkpoint)"]
    assert best["residual"] < dep["tolerance"] / 10 and all(not t["reproduces"] for t in rest)


def test_the_reference_points_are_held_one_layer_at_a_time():
    """Judged as each layer is named, then dropped: what stays is the residual stream (the resume
    point of a simulation), so memory follows one layer's activations, not the model's."""
    from dumpcompare.checkpoint import load
    from dumpcompare.naming import Namer, load_profiles
    from dumpcompare.refpoints import point_arrays
    from dumpcompare import refmodel

    ckpt = load(CORPUS / "_models" / "llama")
    namer = Namer(load_profiles(None))
    seen = []

    def on_layer(arrays):
        seen.append(sorted({k.split(".")[0] for k in arrays if not k.endswith(("resid_in", "resid_out"))
                            and k.startswith("L")}))

    ids = np.arange(3, 11)
    run_ = point_arrays(refmodel.forward(ckpt, ckpt.config, ids), namer, on_layer=on_layer)
    layers = ckpt.config["num_hidden_layers"]
    assert seen == [[f"L{n}"] for n in range(layers)]
    kept = {k for k in run_.arrays if k.startswith("L")}
    assert kept == {f"L{n}.resid_{w}" for n in range(layers) for w in ("in", "out")} & set(run_.order)
    full = point_arrays(refmodel.forward(ckpt, ckpt.config, ids), namer)
    assert len(full.order) == len(run_.order) and set(full.arrays) > set(run_.arrays)
    for k, a in run_.arrays.items():
        np.testing.assert_array_equal(a, full.arrays[k])


@pytest.mark.parametrize("form", ["tokens_json", "logprob_jsonl"])
def test_token_ids_as_users_hold_them_give_the_same_forward(form, tmp_path, llama_ids):
    """The ids of a tokens.json ({prompt_ids, response_ids}, as dump_vllm.py writes it) or of a
    one-sequence log-prob JSONL are the whole sequence, prompt then response."""
    ids = json.loads(llama_ids)
    prompt, response = ids[:5], ids[5:]
    path = tmp_path / "ids.json"
    if form == "tokens_json":
        path.write_text(json.dumps({"prompt_ids": prompt, "response_ids": response}), encoding="utf-8")
    else:
        path.write_text(json.dumps({"id": "s0", "prompt_ids": prompt, "token_ids": response,
                                    "logprobs": [-1.0] * len(response)}) + "\n", encoding="utf-8")
    out = tmp_path / "o"
    assert run(COMPARE, "llama_tp1_fp32_clean", out, "--token-ids", str(path)).returncode == 0
    rf = _forward(out)
    assert rf["tokens"]["train"]["how"] == "given" and rf["tokens"]["train"]["ids"] == ids
    _assert_clean(rf)


def test_token_ids_of_several_sequences_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt_ids": [1, 2], "token_ids": [3], "logprobs": [-1.0]}) + "\n"
                            for i in range(2)), encoding="utf-8")
    proc = run(COMPARE, "llama_tp1_fp32_clean", tmp_path / "o", "--token-ids", str(path))
    assert proc.returncode == 2
    assert str(path) in proc.stderr and "holds 2 records" in proc.stderr and "Traceback" not in proc.stderr
