"""Real megatron-core train dumps against vLLM-structured rollouts (tests/data/real/megatron_*,
written by tools/make_real_dumps.py from tools/real_dumps/cases_megatron.py; no torch needed here).

(a) the train dumps are what megatron-core 0.16's GPTModel with the local layer spec writes: module
    paths and class names (IdentityOp placeholders included), sequence-first [s, b, h] hidden
    states, one rank folder per TP x PP rank, each pipeline stage numbering its layers from 0;
(b) the root-cause command, run as a user runs it (no step or rank flag), gives each case's
    expected verdict, category, side and modules.  Cases the pipeline gets wrong today are in
    XFAIL with what it says instead (strict: remove the line when a fix lands).
"""
from __future__ import annotations

import json
import re

import pytest
from real.corpus_check import CORPUS, case_doc, disagreements, run_default_command

CASES = sorted(p.parent.name for p in CORPUS.glob("*/case.json")
               if json.loads(p.read_text(encoding="utf-8"))["train"]["engine"] == "megatron-core")

# case -> what the pipeline says today instead of the expected answer.
XFAIL = {
}

# Module path -> class name in megatron-core 0.16 (models/gpt/gpt_model.py, gpt_layer_specs.py
# get_gpt_layer_local_spec; transformer/transformer_layer.py, attention.py,
# dot_product_attention.py, mlp.py; tensor_parallel/layers.py).  "N" is a stage-local layer
# index.  The root GPTModel is not dumped (msprobe skips the model it was started on).
MEGATRON_TREE = {
    "embedding": "LanguageModelEmbedding",
    "embedding.word_embeddings": "VocabParallelEmbedding",
    "embedding.embedding_dropout": "Dropout",
    "rotary_pos_emb": "RotaryEmbedding",
    "decoder": "TransformerBlock",
    "decoder.layers.N": "TransformerLayer",
    "decoder.layers.N.input_layernorm": "RMSNorm",
    "decoder.layers.N.self_attention": "SelfAttention",
    "decoder.layers.N.self_attention.linear_qkv": "ColumnParallelLinear",
    "decoder.layers.N.self_attention.q_layernorm": "IdentityOp",
    "decoder.layers.N.self_attention.k_layernorm": "IdentityOp",
    "decoder.layers.N.self_attention.core_attention": "DotProductAttention",
    "decoder.layers.N.self_attention.core_attention.scale_mask_softmax": "FusedScaleMaskSoftmax",
    "decoder.layers.N.self_attention.core_attention.attention_dropout": "Dropout",
    "decoder.layers.N.self_attention.linear_proj": "RowParallelLinear",
    "decoder.layers.N.pre_cross_attn_layernorm": "IdentityOp",
    "decoder.layers.N.cross_attention": "IdentityOp",
    "decoder.layers.N.cross_attn_bda": "IdentityFuncOp",
    "decoder.layers.N.pre_mlp_layernorm": "RMSNorm",
    "decoder.layers.N.mlp": "MLP",
    "decoder.layers.N.mlp.linear_fc1": "ColumnParallelLinear",
    "decoder.layers.N.mlp.linear_fc2": "RowParallelLinear",
    "decoder.final_layernorm": "RMSNorm",
    "output_layer": "ColumnParallelLinear",
}
_FIRST_STAGE = {"embedding", "embedding.word_embeddings", "embedding.embedding_dropout"}
_LAST_STAGE = {"decoder.final_layernorm", "output_layer"}

_KEY = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[A-Za-z0-9_]+)\.forward\.\d+$")


def _params(names):
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=XFAIL[n])) if n in XFAIL else n
            for n in names]


def _first_leaf(item):
    while isinstance(item, list) and item:
        item = item[0]
    return item


def test_corpus_has_every_megatron_layout():
    layouts = {(c["train"]["tp"], c["train"]["pp"], c["train"]["sequence_parallel"], c["rollout"]["tp"], c["mode"])
               for c in map(case_doc, CASES)}
    assert {(1, 1, False, 1, "statistics"), (2, 1, False, 2, "statistics"), (2, 1, False, 1, "statistics"),
            (2, 1, True, 2, "statistics"), (1, 2, False, 1, "statistics"), (1, 1, False, 1, "tensor"),
            (2, 1, False, 2, "tensor"), (2, 1, True, 2, "tensor"), (1, 1, False, 1, "md5")} <= layouts
    assert {c["case"] for c in map(case_doc, CASES) if c["dtype"]["train"] == "bf16" and c["train"]["wrappers"]}
    assert {c["train"]["tp"] for c in map(case_doc, CASES) if c["train"]["padded_vocab"]} == {1, 2}
    assert any(c["rollout"]["steps"] > 1 for c in map(case_doc, CASES))
    assert any(c["train"].get("vp", 1) > 1 and c["fault"] for c in map(case_doc, CASES)), "a virtual pipeline"


@pytest.mark.parametrize("name", CASES)
def test_train_dump_is_megatrons(name):
    case = case_doc(name)
    tp, pp, sp = case["train"]["tp"], case["train"]["pp"], case["train"]["sequence_parallel"]
    vp, n_layers = case["train"].get("vp", 1), case["train"].get("layers", 2)
    assert sorted(p.name for p in (CORPUS / name / "train").iterdir()) == ["step0"], "one train forward"
    ranks = sorted(p.name for p in (CORPUS / name / "train" / "step0").iterdir())
    assert ranks == [f"rank{r}" for r in range(tp * pp)]
    tokens, hidden = case["train"]["tokens"], 64
    vocab_rows = case["train"]["padded_vocab"] or case["train"]["vocab"]
    for r in range(tp * pp):
        stage = r // tp
        data = json.loads((CORPUS / name / "train" / "step0" / f"rank{r}" / "dump.json").read_text(encoding="utf-8"))["data"]
        seen = {}
        for key, entry in data.items():
            m = _KEY.match(key)
            assert m, f"{key} is not an L0 module forward key"
            seen[re.sub(r"decoder\.layers\.\d+", "decoder.layers.N", m["path"])] = m["cls"]
            if m["path"].endswith(("input_layernorm", "pre_mlp_layernorm")):
                # sequence-first; under sequence parallel each rank holds a slice of the sequence
                assert _first_leaf(entry["output"])["shape"] == [tokens // tp if sp else tokens, 1, hidden]
            if m["path"].endswith("output_layer"):
                # vocab-parallel logits, Megatron-LM's padding rows included
                assert _first_leaf(entry["output"])["shape"] == [tokens, 1, vocab_rows // tp]
                assert entry["parameters"]["weight"]["shape"] == [vocab_rows // tp, hidden]
        want = {}
        for chunk in range(vp):
            tree = dict(MEGATRON_TREE)
            first, last = stage == 0 and chunk == 0, stage == pp - 1 and chunk == vp - 1
            for path in (_FIRST_STAGE if not first else set()) | (_LAST_STAGE if not last else set()):
                del tree[path]
            # a virtual pipeline's chunks: msprobe, started on the list, names each by its index
            want.update({f"{chunk}.{p}" if vp > 1 else p: c for p, c in tree.items()})
        if case["train"].get("wrappers"):
            # Megatron-LM's [DDP(Float16Module(GPTModel))]: msprobe, started on the list, dumps the
            # inner modules under the list index and both wrapper levels
            want = {"0.module": "Float16Module", "0.module.module": "GPTModel",
                    **{f"0.module.module.{p}": c for p, c in want.items()}}
        assert seen == want, f"rank {r}"
        layers = {int(k.split("decoder.layers.")[1].split(".")[0]) for k in data if "decoder.layers." in k}
        assert layers == set(range(n_layers // pp // vp)), f"rank {r}: each stage (chunk) numbers its layers from 0"


@pytest.fixture(scope="session")
def reports(tmp_path_factory):
    """The root-cause command's answer on every Megatron case."""
    return run_default_command(CASES, tmp_path_factory.mktemp("real_megatron"), workers=2)


@pytest.mark.parametrize("name", _params(CASES))
def test_default_command_finds_the_injected_fault(name, reports):
    assert disagreements(case_doc(name)["expected"], *reports[name]) == []
