"""The real corpus (tests/data/real/, written by tools/make_real_dumps.py): real msprobe dumps of
transformers train sides and vLLM-structured rollouts, each with a case.json stating the injected
fault and the expected answer.

(a) the rollout dumps carry vLLM's module paths and class names (a list taken from vLLM's source);
(b) the root-cause command, run as a user runs it (no step or rank flag), gives each case's
    expected verdict, category, side and modules (``expected_without_model`` where the fault shows
    only against the checkpoint's forward: tests/real/test_real_expert_parallel.py runs that one
    with --model too).  Cases the pipeline gets wrong today are listed
    in XFAIL with what it says instead; the lead removes a line when a fix lands (strict: an
    unexpected pass fails).
"""
from __future__ import annotations

import json
import re

import pytest
from real.corpus_check import CORPUS, default_expected, disagreements, run_default_command, run_pair

# megatron-core train sides have their own module tree and xfail table: tests/real/test_real_megatron.py;
# rollouts under a tree no profile describes (renamed_like) are tests/mapping_values/'s.
CASES = sorted(p.parent.name for p in CORPUS.glob("*/case.json")
               if json.loads(p.read_text(encoding="utf-8"))["train"]["engine"] != "megatron-core"
               and json.loads(p.read_text(encoding="utf-8"))["rollout"]["engine"] != "renamed_like")

# Module path -> class name in vLLM 0.10.1 (vllm/model_executor/models/llama.py, qwen2.py,
# qwen3.py, gemma2.py, phi3.py; layers/linear.py, layernorm.py, activation.py,
# rotary_embedding.py, vocab_parallel_embedding.py, logits_processor.py; attention/layer.py).
# "N" stands for any layer index. lm_head (ParallelLMHead) is never called, so never dumped.
# As real vLLM 0.32 dumps them (tests/data/real_vllm/): the ``model`` module (LlamaModel, ...) is
# never dumped (@support_torch_compile calls its forward without nn.Module's hooks); the one shared
# rotary module appears only as model.layers.0.self_attn.rotary_emb; the MoE router is a GateLinear
# and the experts a MoERunner (layers/fused_moe/router/gate_linear.py, runner/moe_runner.py).
_LLAMA = {
    "model.embed_tokens": "VocabParallelEmbedding",
    "model.layers.N": "LlamaDecoderLayer",
    "model.layers.N.input_layernorm": "RMSNorm",
    "model.layers.N.self_attn": "LlamaAttention",
    "model.layers.N.self_attn.qkv_proj": "QKVParallelLinear",
    "model.layers.N.self_attn.rotary_emb": "RotaryEmbedding",
    "model.layers.N.self_attn.attn": "Attention",
    "model.layers.N.self_attn.o_proj": "RowParallelLinear",
    "model.layers.N.post_attention_layernorm": "RMSNorm",
    "model.layers.N.mlp": "LlamaMLP",
    "model.layers.N.mlp.gate_up_proj": "MergedColumnParallelLinear",
    "model.layers.N.mlp.act_fn": "SiluAndMul",
    "model.layers.N.mlp.down_proj": "RowParallelLinear",
    "model.norm": "RMSNorm",
    "logits_processor": "LogitsProcessor",
}


def _renamed(tree, **classes):
    return {path: classes.get(cls, cls) for path, cls in tree.items()}


_QWEN2 = _renamed(_LLAMA, LlamaModel="Qwen2Model", LlamaDecoderLayer="Qwen2DecoderLayer",
                  LlamaAttention="Qwen2Attention", LlamaMLP="Qwen2MLP")
# qwen3.py imports Qwen2MLP as Qwen3MLP: the class name stays Qwen2MLP
_QWEN3 = {**_renamed(_LLAMA, LlamaModel="Qwen3Model", LlamaDecoderLayer="Qwen3DecoderLayer",
                     LlamaAttention="Qwen3Attention", LlamaMLP="Qwen2MLP"),
          "model.layers.N.self_attn.q_norm": "RMSNorm", "model.layers.N.self_attn.k_norm": "RMSNorm"}
_GEMMA2 = {**_renamed(_LLAMA, LlamaModel="Gemma2Model", LlamaDecoderLayer="Gemma2DecoderLayer",
                      LlamaAttention="Gemma2Attention", LlamaMLP="Gemma2MLP", SiluAndMul="GeluAndMul",
                      RMSNorm="GemmaRMSNorm"),
           "model.layers.N.pre_feedforward_layernorm": "GemmaRMSNorm",
           "model.layers.N.post_feedforward_layernorm": "GemmaRMSNorm"}
# qwen3_moe.py; layers/fused_moe/layer.py: the MoE block replaces the dense MLP in every layer
_QWEN3_MOE = {**{p: c for p, c in _renamed(_QWEN3, Qwen3Model="Qwen3MoeModel",
                                            Qwen3DecoderLayer="Qwen3MoeDecoderLayer",
                                            Qwen3Attention="Qwen3MoeAttention").items()
                 if not p.startswith("model.layers.N.mlp")},
              "model.layers.N.mlp": "Qwen3MoeSparseMoeBlock", "model.layers.N.mlp.gate": "GateLinear",
              "model.layers.N.mlp.experts": "MoERunner"}
# mixtral.py: the MoE block keeps the checkpoint's old name block_sparse_moe (transformers 5.x: mlp)
_MIXTRAL = {**{p: c for p, c in _renamed(_LLAMA, LlamaModel="MixtralModel", LlamaDecoderLayer="MixtralDecoderLayer",
                                          LlamaAttention="MixtralAttention").items()
               if not p.startswith("model.layers.N.mlp")},
            "model.layers.N.block_sparse_moe": "MixtralMoE",
            "model.layers.N.block_sparse_moe.gate": "GateLinear",
            "model.layers.N.block_sparse_moe.experts": "MoERunner"}
# vLLM maps MistralForCausalLM to llama.py's LlamaForCausalLM; Phi3ForCausalLM subclasses it.
VLLM_TREES = {"llama": _LLAMA, "mistral": _LLAMA, "phi3": _LLAMA, "qwen2": _QWEN2, "qwen3": _QWEN3,
              "gemma2": _GEMMA2, "qwen3_moe": _QWEN3_MOE, "mixtral": _MIXTRAL}
# SGLang 0.4.10 (python/sglang/srt/models/llama.py, qwen3.py; srt/layers/radix_attention.py): the
# same names as vLLM except the attention kernel module; its model module is dumped
# (sglang_like is checked against SGLang's source, not a real SGLang dump: tools/real_dumps/README.md).
_MODEL_CLASS = {"llama": "LlamaModel", "qwen2": "Qwen2Model", "qwen3": "Qwen3Model"}
SGLANG_TREES = {f: {"model": _MODEL_CLASS[f], **_renamed(t, Attention="RadixAttention")}
                for f, t in VLLM_TREES.items() if f in ("llama", "qwen2", "qwen3")}

# case -> what the pipeline says today instead of the expected answer (one line each).
XFAIL: dict[str, str] = {}

_KEY = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[A-Za-z0-9_]+)\.forward\.\d+$")


def _case(name):
    return json.loads((CORPUS / name / "case.json").read_text(encoding="utf-8"))


def _params(names):
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=XFAIL[n])) if n in XFAIL else n
            for n in names]


@pytest.mark.parametrize("name", CASES)
def test_rollout_tree_is_vllms(name):
    case = _case(name)
    tree = (SGLANG_TREES if case["rollout"]["engine"] == "sglang_like" else VLLM_TREES)[case["family"]]
    fault = case["fault"] or {}
    allowed_extra = {fault["target"]} if fault.get("kind") == "extra_op" else set()
    seen = {}
    for dump in sorted((CORPUS / name / "rollout").glob("step*/*/dump.json")):
        for key in json.loads(dump.read_text(encoding="utf-8"))["data"]:
            m = _KEY.match(key)
            assert m, f"{dump}: {key} is not an L0 module forward key"
            seen[m["path"]] = m["cls"]
    generic = {}
    for path, cls in seen.items():
        if path in allowed_extra:
            continue
        generic.setdefault(re.sub(r"\.layers\.\d+", ".layers.N", path), set()).add(cls)
    assert {p: sorted(c) for p, c in generic.items()} == {p: [c] for p, c in tree.items()}


def _rank_dumps(name, step="step0"):
    return {int(d.name[4:]): json.loads((d / "dump.json").read_text(encoding="utf-8"))["data"]
            for d in sorted((CORPUS / name / "rollout" / step).glob("rank*"))}


def _entry(data, path):
    return next(v for k, v in data.items() if _KEY.match(k) and _KEY.match(k)["path"] == path)


TP_CASES = [n for n in CASES if _case(n)["rollout"]["tp"] > 1 and _case(n)["family"] in ("llama", "qwen2", "phi3")]


@pytest.mark.parametrize("name", TP_CASES)
def test_tp_ranks_hold_vllms_shards(name):
    """Each rank's parameters are its shard as vLLM cuts them: vocabulary padded to a multiple of
    64 and split in rows, q heads split and the one KV head replicated, gate/up split per part,
    down_proj split in columns; the logits reach every rank (vLLM 0.32 all-gathers them, as SGLang
    does)."""
    case = _case(name)
    cfg = json.loads((CORPUS / "_models" / case["family"] / "config.json").read_text(encoding="utf-8"))
    tp, hidden, inter = case["rollout"]["tp"], cfg["hidden_size"], cfg["intermediate_size"]
    head = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    kv_heads = max(1, cfg["num_key_value_heads"] // tp)
    padded = -(-cfg["vocab_size"] // 64) * 64
    ranks = _rank_dumps(name)
    assert sorted(ranks) == list(range(tp))
    for rank, data in ranks.items():
        shape = lambda path: _entry(data, path)["parameters"]["weight"]["shape"]  # noqa: E731
        assert shape("model.embed_tokens") == [padded // tp, hidden]
        assert shape("model.layers.0.self_attn.qkv_proj") == [
            (cfg["num_attention_heads"] // tp + 2 * kv_heads) * head, hidden]
        assert shape("model.layers.0.mlp.gate_up_proj") == [2 * inter // tp, hidden]
        assert shape("model.layers.0.mlp.down_proj") == [hidden, inter // tp]
        logits = _entry(data, "logits_processor")["output"][0]
        assert logits is not None, rank
        if case["rollout"]["engine"] != "sglang_like":  # SGLang returns a LogitsProcessorOutput
            assert logits["shape"][-1] == cfg["vocab_size"], rank


MOE_TP_CASES = [n for n in CASES if _case(n)["rollout"]["tp"] > 1 and _case(n)["family"] == "qwen3_moe"]


@pytest.mark.parametrize("name", MOE_TP_CASES)
def test_reduces_are_inside_the_modules(name):
    """RowParallelLinear reduces inside its forward (o_proj equal on every rank); so does vLLM
    0.32's MoERunner (the experts' output is the full sum on every rank, the block adds nothing)."""
    ranks = _rank_dumps(name)
    stat = lambda rank, path: {k: _entry(ranks[rank], path)["output"][0][k]  # noqa: E731
                               for k in ("Max", "Min", "Mean", "Norm")}
    for layer in (0, 1):
        prefix = f"model.layers.{layer}"
        assert stat(0, f"{prefix}.self_attn.o_proj") == stat(1, f"{prefix}.self_attn.o_proj")
        assert stat(0, f"{prefix}.mlp") == stat(1, f"{prefix}.mlp")
        assert stat(0, f"{prefix}.mlp.experts") == stat(1, f"{prefix}.mlp.experts")


@pytest.fixture(scope="session")
def reports(tmp_path_factory):
    """The root-cause command's answer on every case."""
    return run_default_command(CASES, tmp_path_factory.mktemp("real"))


@pytest.mark.parametrize("name", _params(CASES))
def test_default_command_finds_the_case(name, reports):
    code, stderr, doc = reports[name]
    assert disagreements(default_expected(_case(name)), code, stderr, doc) == []


def test_every_fault_is_well_above_the_noise():
    """The generator's measurement: each fault moves its module far more than the engines differ."""
    for name in CASES:
        case = _case(name)
        if case["fault"] is not None:
            assert case["measured"]["ratio"] == "inf" or case["measured"]["ratio"] >= 10, name


def test_decode_steps_count_modules_once(tmp_path):
    """A rollout dumped over a prefill and decode steps calls every module once per step; the
    coverage counts modules, and the later calls are stitched, not one-sided modules."""
    code, err, _doc = run_pair(CORPUS / "llama_gen_fp32_clean" / "train", CORPUS / "llama_gen_fp32_clean" / "rollout",
                               tmp_path)
    assert code == 0, err
    s = json.loads((tmp_path / "output_2_mapping.json").read_text(encoding="utf-8"))["summary"]
    steps = len(list((CORPUS / "llama_gen_fp32_clean" / "rollout").iterdir()))
    assert steps > 1 and s["rollout_calls"] == steps * s["rollout_modules"]
    assert s["stitched_calls"]["rollout"] == (steps - 1) * s["mapped_rollout_modules"]
    assert s["rollout_only"] == s["rollout_modules"] - s["mapped_rollout_modules"] < s["rollout_modules"] // 2


def test_report_says_why_tensor_logits_were_not_compared(tmp_path):
    """Megatron keeps every position's logits, the vLLM-shaped rollout only the sampled one: the
    report says the logits were not compared and why, never that the dump holds no tensors."""
    name = "megatron_tp1_tensor_clean"
    code, err, _doc = run_pair(CORPUS / name / "train", CORPUS / name / "rollout", tmp_path)
    assert code == 0, err
    lp = json.loads((tmp_path / "output_3_value_compare.json").read_text(encoding="utf-8"))["logprob"]
    assert (lp["mode"], lp["status"]) == ("tensor", "incomparable") and "shape conflict" in lp["reason"]
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "were not compared: shape conflict" in html and "the dump holds no tensors" not in html
