"""Megatron-core train side against a vllm_like rollout of the same HF weights: the cases.

Every case converts one tiny HF Llama (``megatron_side.make_hf_llama``) twice: into a megatron-core
``GPTModel`` in the case's layout (train, one msprobe step, ``[s, b, h]``) and into the vLLM-shaped
model (rollout: prefill of the 8 prompt tokens as ``step0``, then one step per decoded token when
the case generates; the train forward then holds the prompt and the sampled tokens but the last).
A fault changes one side only.
tools/make_real_dumps.py finds this module (``--list`` shows the cases, ``--only NAME`` makes one).

Public API:
    MegatronCase            dataclass: name, layout (megatron_side.Layout), rollout_tp, mode
                            (statistics, tensor or md5), dtype ("fp32"; "bf16": both sides, the
                            train side wrapped as Megatron-LM wraps it), fault
    CASES                   name -> MegatronCase, in generation order
    make_case(case, root) -> dict   writes root/<name>/{train,rollout}/ and case.json, returns the doc

case.json follows the corpus schema (cases.describe): ``expected`` is derived from the injected
fault and checked against the activations: the faulty module's output must move by more than
``MIN_RATIO`` times the largest clean train-vs-rollout difference at modules both engines compute
identically (``cases.check_signal``).
"""
from __future__ import annotations

import json
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .cases import CLEAN_EXPECTED, check_signal
from .megatron_side import HF_CONFIG, Conversion, Layout, megatron_lm_padded_vocab

PROMPT_LEN = 8
WEIGHT_CATEGORY = "parameter_or_checkpoint_issue"

# Megatron module -> the vLLM module that outputs the same tensor (same shape once the batch dim
# is flattened, TP outputs all-reduced on both sides); used to measure the noise of a clean pair.
_ALIGNED = {"embedding": "model.embed_tokens", "decoder.final_layernorm": "model.norm"}
_ALIGNED_LAYER = {"input_layernorm": "input_layernorm", "pre_mlp_layernorm": "post_attention_layernorm",
                  "self_attention.linear_proj": "self_attn.o_proj", "mlp.linear_fc2": "mlp.down_proj"}


@dataclass(frozen=True)
class MegatronCase:
    name: str
    layout: Layout = Layout()
    rollout_tp: int = 1
    mode: str = "statistics"
    dtype: str = "fp32"
    fault: dict | None = None
    new_tokens: int = 1  # rollout forwards: the prefill, then one per decoded token
    vocab: int = HF_CONFIG["vocab_size"]
    pad_vocab: bool = False  # as Megatron-LM does (vLLM pads to a multiple of 64 in any case)
    layers: int = HF_CONFIG["num_hidden_layers"]

    @property
    def padded_vocab(self) -> int | None:
        return megatron_lm_padded_vocab(self.vocab, self.layout.tp) if self.pad_vocab else None

    def summary(self) -> str:
        """One line for ``make_real_dumps.py --list``."""
        lay = self.layout
        return (f"megatron tp={lay.tp} pp={lay.pp}{f' vp={lay.vp}' if lay.vp > 1 else ''}{' sp' if lay.sp else ''} {self.mode} {self.dtype} "
                f"rollout tp={self.rollout_tp} steps={self.new_tokens}")

    @property
    def conversion(self) -> Conversion:
        f = self.fault or {}
        if f.get("kind") == "qkv_order":
            return Conversion(qkv_order="plain", padded_vocab=self.padded_vocab)
        if f.get("kind") == "wrong_shard":
            return Conversion(wrong_gate_shard=(f["layer"], f["rank"], f["from_rank"]),
                              padded_vocab=self.padded_vocab)
        return Conversion(padded_vocab=self.padded_vocab)


def _fault(side, kind, target, detail, train, rollout, params=(), rank=None, **extra):
    """A fault as case.json shows it; ``train``/``rollout`` are the modules a right answer names
    (global layer numbers: a pipeline stage's local ``decoder.layers.0`` may be layer 1)."""
    return {"side": side, "kind": kind, "target": target, "rank": rank, "detail": detail,
            "params": list(params), "train_modules": train, "rollout_modules": rollout, **extra}


_FC1_STALE = _fault(
    "train", "stale_weight", "decoder.layers.1.mlp.linear_fc1",
    "train side loaded layer 1 gate_proj and up_proj (fused into linear_fc1) from an older step",
    ["decoder.layers.1.mlp.linear_fc1"], ["model.layers.1.mlp.gate_up_proj"],
    params=("model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight"))
_O_PROJ_STALE = _fault(
    "rollout", "stale_weight", "model.layers.0.self_attn.o_proj",
    "rollout kept layer 0 o_proj.weight of the previous step (weight sync missed it)",
    ["decoder.layers.0.self_attention.linear_proj"], ["model.layers.0.self_attn.o_proj"],
    params=("model.layers.0.self_attn.o_proj.weight",))
# linear_qkv's weight and output equal the rollout's qkv_proj row for row (statistics too), so the
# first visible divergence is at the split: train's q/k (q_layernorm, k_layernorm IdentityOps) and
# core_attention.  The side is the train's because Megatron's split is per query group, so a fused
# train weight in vLLM's [q; k; v] order is a train-side conversion error.
_QKV_PLAIN = _fault(
    "train", "qkv_order", "decoder.layers.0.self_attention.linear_qkv",
    "HF->Megatron conversion stacked q, k, v as [q; k; v] instead of Megatron's per-query-group "
    "[q_g; k_g; v_g] (every layer; layer 0 is the first to diverge)",
    ["decoder.layers.0.self_attention.linear_qkv"], ["model.layers.0.self_attn.qkv_proj"],
    side_shown=True)

_FC1_WRONG_SHARD = _fault(
    "train", "wrong_shard", "decoder.layers.1.mlp.linear_fc1",
    "TP rank 1 loaded rank 0's gate rows into its layer 1 linear_fc1 shard",
    ["decoder.layers.1.mlp.linear_fc1"], ["model.layers.1.mlp.gate_up_proj"], rank=1, layer=1,
    from_rank=0)

# Chunk 1 of pipeline rank 0 holds layer 2 as its local ``decoder.layers.0``: the dump names it
# ``1.module...decoder.layers.0`` (msprobe is started on the list of chunks).
_FC1_STALE_VP = _fault(
    "train", "stale_weight", "decoder.layers.2.mlp.linear_fc1",
    "train side loaded layer 2 gate_proj and up_proj (fused into linear_fc1; virtual-pipeline chunk 1 "
    "of pipeline rank 0) from an older step",
    ["decoder.layers.2.mlp.linear_fc1"], ["model.layers.2.mlp.gate_up_proj"],
    params=("model.layers.2.mlp.gate_proj.weight", "model.layers.2.mlp.up_proj.weight"))

_TP2, _SP, _PP2, _VP = Layout(tp=2), Layout(tp=2, sp=True), Layout(pp=2), Layout(pp=2, vp=2)

CASES = {c.name: c for c in [
    MegatronCase("megatron_tp1_clean"),
    MegatronCase("megatron_tp2_clean", _TP2, rollout_tp=2),
    MegatronCase("megatron_tp2_clean_rollout_tp1", _TP2),
    MegatronCase("megatron_tp2_sp_clean", _SP, rollout_tp=2),
    MegatronCase("megatron_pp2_clean", _PP2),
    MegatronCase("megatron_tp1_fc1_stale_train", fault=_FC1_STALE),
    MegatronCase("megatron_tp1_o_proj_stale_rollout", fault=_O_PROJ_STALE),
    MegatronCase("megatron_tp1_qkv_plain_order", fault=_QKV_PLAIN),
    MegatronCase("megatron_pp2_fc1_stale_train", _PP2, fault=_FC1_STALE),
    MegatronCase("megatron_tp2_fc1_wrong_shard_train", _TP2, rollout_tp=2, fault=_FC1_WRONG_SHARD),
    MegatronCase("megatron_tp1_tensor_clean", mode="tensor"),
    MegatronCase("megatron_tp2_tensor_fc1_stale_train", _TP2, rollout_tp=2, mode="tensor", fault=_FC1_STALE),
    MegatronCase("megatron_tp1_tensor_qkv_plain_order", mode="tensor", fault=_QKV_PLAIN),
    MegatronCase("megatron_tp2_sp_tensor_clean", _SP, rollout_tp=2, mode="tensor"),
    MegatronCase("megatron_tp1_md5_clean", mode="md5"),
    MegatronCase("megatron_tp1_md5_fc1_stale_train", mode="md5", fault=_FC1_STALE),
    MegatronCase("megatron_tp1_bf16_ddp_clean", dtype="bf16"),
    MegatronCase("megatron_tp1_bf16_ddp_fc1_stale_train", dtype="bf16", fault=_FC1_STALE),
    # vocabulary 300: Megatron-LM builds 384 rows (512 with TP=2), vLLM 320
    MegatronCase("megatron_tp1_padded_vocab_clean", vocab=300, pad_vocab=True),
    MegatronCase("megatron_tp2_padded_vocab_clean", _TP2, rollout_tp=2, vocab=300, pad_vocab=True),
    # a generation: the train forward holds prompt + sampled tokens, the rollout one step per forward
    MegatronCase("megatron_tp1_gen_clean", new_tokens=4),
    MegatronCase("megatron_tp1_gen_o_proj_stale_rollout", new_tokens=4, fault=_O_PROJ_STALE),
    # virtual pipeline: 4 layers, 2 pipeline ranks x 2 chunks of one layer each
    MegatronCase("megatron_pp2_vp2_clean", _VP, layers=4),
    MegatronCase("megatron_pp2_vp2_fc1_stale_train", _VP, layers=4, fault=_FC1_STALE_VP),
]}


def _states(case, clean):
    """(train state, rollout state) of a case: the clean HF weights, but for the faulty side."""
    f = case.fault
    if f is None or f["kind"] != "stale_weight":
        return clean, clean
    from .sides import stale

    bad = clean
    for seed, name in enumerate(f["params"], start=5):
        bad = stale(bad, name, seed)
    return (bad, clean) if f["side"] == "train" else (clean, bad)


def _aligned(layers):
    out = dict(_ALIGNED)
    for i in range(layers):
        for mg, vl in _ALIGNED_LAYER.items():
            out[f"decoder.layers.{i}.{mg}"] = f"model.layers.{i}.{vl}"
    return out


def _rel(a, b):
    import torch

    return float(torch.linalg.norm(a - b) / max(float(torch.linalg.norm(b)), 1e-30))


def _load_ranks(scratch, side, ranks, run):
    import torch

    out = {}
    for r in ranks:  # pipeline stages hold different layers; TP ranks the same names (first wins)
        for name, t in torch.load(Path(scratch) / f"{side}_rank{r}.pt")[run].items():
            out.setdefault(name, t)
    return out


def measure(case, scratch):
    """Signal of the fault at its module and the clean train-vs-rollout noise (rank 0 tensors)."""
    world = case.layout.world
    train = _load_ranks(scratch, "train", range(world), "clean")
    rollout = _load_ranks(scratch, "rollout", range(case.rollout_tp), "clean")
    noise, where = 0.0, None
    for mg, vl in _aligned(case.layers).items():
        t, r = train.get(mg), rollout.get(vl)
        if t is None or r is None:
            continue
        t = t.reshape(-1, t.shape[-1])
        if not case.layout.sp:  # the rollout captures hold the prefill rows only
            t = t[:r.shape[0]]
        if t.shape != r.shape:  # a sequence-parallel shard: not the same tensor
            continue
        e = _rel(t, r)
        if e >= noise:
            noise, where = e, mg
    out = {"noise": noise, "noise_module": where}
    f = case.fault
    if f is None:
        return out
    side, n = ("train", world) if f["side"] == "train" else ("rollout", case.rollout_tp)
    ranks = range(n) if f["rank"] is None else [f["rank"]]
    faulty = _load_ranks(scratch, side, ranks, "dumped")[f["target"]]
    clean = _load_ranks(scratch, side, ranks, "clean")[f["target"]]
    signal = _rel(faulty, clean)
    return {**out, "module": f["target"], "rank": f["rank"], "rel_error": signal,
            "ratio": signal / noise if noise else float("inf")}


def _expected(case, measured):
    f = case.fault
    if f is None:
        return dict(CLEAN_EXPECTED)
    check_signal(case.name, f, measured)
    layer = int(f["target"].split("layers.")[1].split(".")[0])
    return {"verdict": "root_cause_found", "category": WEIGHT_CATEGORY,
            "side": f["side"] if f.get("side_shown") else None,
            "train_modules": f["train_modules"], "rollout_modules": f["rollout_modules"], "layer": layer}


def describe(case, measured):
    """The case.json document (corpus schema 1)."""
    lay = case.layout
    f = case.fault
    public = None if f is None else {k: f[k] for k in ("side", "kind", "target", "rank", "detail")}
    return {
        "schema": 1, "case": case.name, "family": "llama", "mode": case.mode,
        "dtype": {"train": case.dtype, "rollout": case.dtype},
        "train": {"engine": "megatron-core", "tp": lay.tp, "pp": lay.pp, "vp": lay.vp, "sequence_parallel": lay.sp,
                  "layers": case.layers,
                  "layout": "megatron", "vocab": case.vocab, "padded_vocab": case.padded_vocab,
                  "tokens": PROMPT_LEN + case.new_tokens - 1,
                  "wrappers": "[DistributedDataParallel(Float16Module(GPTModel))], the list given to "
                              "msprobe" if case.dtype == "bf16" else None,
                  "notes": "GPTModel, local layer spec, one forward of the prompt and the sampled tokens "
                           "but the last ([s, b, h]); "
                           "rank r = pp_rank * tp + tp_rank"
                           + ("; each rank holds model chunks 0.. (virtual pipeline), msprobe started on "
                              "the list" if lay.vp > 1 else "")},
        "rollout": {"engine": "vllm_like", "tp": case.rollout_tp, "steps": case.new_tokens,
                    "notes": "prefill step0, then one step per decoded token" if case.new_tokens > 1
                    else "prefill only (step0)"},
        "fault": public,
        "expected": _expected(case, measured),
        "measured": measured,
    }


def _round(x):
    if isinstance(x, float):
        return float(f"{x:.4g}") if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


MODEL_DIR = "megatron_llama"


def save_model(hf_model, root) -> None:
    """The HF checkpoint the Megatron cases (default vocabulary) convert, as ``_models/megatron_llama``:
    the reference the sides are checked against (its weights and config differ from ``_models/llama``)."""
    dest = Path(root) / "_models" / MODEL_DIR
    if dest.exists():
        shutil.rmtree(dest)
    hf_model.save_pretrained(dest, safe_serialization=True)


def make_case(case, root):
    """Write ``root/<case.name>/`` (train/, rollout/, case.json); returns the case.json document."""
    import megatron.core  # noqa: F401  imported before forking so that every rank starts warm
    import torch

    from . import megatron_side, msprobe_run

    dest = Path(root) / case.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    hf = megatron_side.make_hf_llama(vocab_size=case.vocab, layers=case.layers)
    if case.vocab == HF_CONFIG["vocab_size"] and case.layers == HF_CONFIG["num_hidden_layers"]:
        save_model(hf, root)
    clean = megatron_side.model_state(hf)
    train_state, rollout_state = _states(case, clean)
    prompt = torch.randint(3, case.vocab, (PROMPT_LEN,),
                           generator=torch.Generator().manual_seed(42))
    with tempfile.TemporaryDirectory() as scratch:
        msprobe_run.run_ranks(megatron_side.rollout_rank, case.rollout_tp, case.mode, case.dtype,
                              rollout_state, clean, prompt.tolist(), case.new_tokens, str(dest / "rollout"),
                              scratch)
        # the last sampled token was never fed to an engine forward
        sampled = json.loads((Path(scratch) / "tokens.json").read_text())[:-1]
        ids = torch.cat([prompt, torch.tensor(sampled, dtype=prompt.dtype)])[None]
        msprobe_run.run_ranks(megatron_side.train_rank, case.layout.world, case.layout, case.mode,
                              case.dtype, case.conversion, train_state, clean, ids, str(dest / "train"),
                              scratch)
        doc = _round(describe(case, measure(case, scratch)))
    (dest / "case.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc

