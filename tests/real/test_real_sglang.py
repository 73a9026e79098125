"""The sglang_* rollouts (tools/real_dumps/sglang_like.py) show what SGLang's source says msprobe sees
(tools/real_dumps/README.md "What SGLang does"): one rotary module for all layers, the model module
dumped, int64 ids, float32 logits in a LogitsProcessorOutput, Qwen3's q/k norms on per-head rows."""
from __future__ import annotations

import json
import re

import pytest
from real.corpus_check import CORPUS

SGLANG = sorted(p.parent.name for p in CORPUS.glob("sglang_*/case.json"))
MODEL_CLASS = {"llama": "LlamaModel", "qwen2": "Qwen2Model", "qwen3": "Qwen3Model"}


def _case(name):
    return json.loads((CORPUS / name / "case.json").read_text(encoding="utf-8"))


def _steps(name):
    """(dump data, construct) of every rollout step and rank."""
    for d in sorted((CORPUS / name / "rollout").glob("step*/rank*")):
        yield (json.loads((d / "dump.json").read_text(encoding="utf-8"))["data"],
               json.loads((d / "construct.json").read_text(encoding="utf-8")))


def _layers(name):
    return json.loads((CORPUS / "_models" / _case(name)["family"] / "config.json").read_text())["num_hidden_layers"]


def test_the_corpus_holds_the_sglang_cases():
    assert len(SGLANG) == 4 and all(_case(n)["rollout"]["engine"] == "sglang_like" for n in SGLANG)


@pytest.mark.parametrize("name", SGLANG)
def test_one_rotary_module_called_once_per_layer(name):
    # get_rope's cache: every layer holds the same object, dumped under its first path; each call's
    # construct.json parent is the attention of the layer that made it
    layers = _layers(name)
    for data, construct in _steps(name):
        rotary = sorted((k for k in data if ".rotary_emb." in k), key=lambda k: int(k.rsplit(".", 1)[1]))
        assert [k.split(".rotary_emb.")[0] for k in rotary] == ["Module.model.layers.0.self_attn"] * layers
        assert [construct[k].split(".self_attn.")[0] for k in rotary] == \
               [f"Module.model.layers.{i}" for i in range(layers)]


@pytest.mark.parametrize("name", SGLANG)
def test_the_model_module_is_dumped_with_int64_ids(name):
    model = f"Module.model.{MODEL_CLASS[_case(name)['family']]}.forward.0"
    for data, construct in _steps(name):
        assert data[model]["input_args"][0]["dtype"] == "torch.int64"
        assert data["Module.model.embed_tokens.VocabParallelEmbedding.forward.0"]["input_args"][0]["dtype"] \
            == "torch.int64"
        layer0 = next(k for k in construct if re.fullmatch(r"Module\.model\.layers\.0\.\w+\.forward\.0", k))
        assert construct[layer0] == model


@pytest.mark.parametrize("name", SGLANG)
def test_logits_are_float32_in_a_logits_processor_output(name):
    for data, _ in _steps(name):
        out = data["Module.logits_processor.LogitsProcessor.forward.0"]["output"][0]
        assert out["next_token_logits"]["dtype"] == "torch.float32"
        assert out["next_token_logits"]["shape"][0] == 1  # the sampled row only
        others = {k: v for k, v in out.items() if k != "next_token_logits"}
        assert others and all(v is None for v in others.values())


def test_qwen3_norms_take_one_row_per_head():
    name = "sglang_qwen3_tp1_bf16_clean"
    cfg = json.loads((CORPUS / "_models" / "qwen3" / "config.json").read_text())
    for data, _ in _steps(name):
        tokens = data["Module.model.embed_tokens.VocabParallelEmbedding.forward.0"]["input_args"][0]["shape"][0]
        for norm, heads in (("q_norm", cfg["num_attention_heads"]), ("k_norm", cfg["num_key_value_heads"])):
            shape = data[f"Module.model.layers.0.self_attn.{norm}.RMSNorm.forward.0"]["input_args"][0]["shape"]
            assert shape == [tokens * heads, cfg["head_dim"]]
