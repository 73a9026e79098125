"""Pairs for the mapping of modules by values and for the MoE naming profiles:

* ``gpt_neox``: a family no naming profile describes, transformers' GPT-NeoX (train) against an
  engine-style re-creation of it with other module names (rollout, renamed_like.py);
* ``mixtral``: transformers 5.x Mixtral (``mlp.gate``, stacked ``mlp.experts``) against vLLM's tree
  (``block_sparse_moe.gate``, FusedMoE ``block_sparse_moe.experts``; mixtral_like.py).

Both sides run the same seeded checkpoint on the same 8-token prompt, one msprobe step each (the
rollout is prefill only, so both hold the same tokens). A fault changes one side's weights only.
tools/make_real_dumps.py finds this module (``--list`` shows the cases, ``--only NAME`` makes one).

Public API:
    ValuesCase              dataclass: name, family ("gpt_neox" | "mixtral"), dtype ("fp32" | "bf16",
                            both sides), fault
    CASES                   name -> ValuesCase, in generation order
    hf_model(family) -> transformers model (fp32, seeded weights)
    make_case(case, root) -> dict   writes root/<name>/{train,rollout}/ and case.json, returns the doc

case.json follows the corpus schema (cases.describe); ``expected`` is derived from the fault (a stale
weight: parameter_or_checkpoint_issue, the side not shown by the dumps) and checked against the
activations (``cases.check_signal``). ``measured.noise``: the modules that carry the same output on
both sides (``_aligned``).
"""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .cases import CLEAN_EXPECTED, check_signal, fault

PROMPT_LEN = 8
_BASE = dict(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, attn_implementation="eager", tie_word_embeddings=False)
# transformers config class, model class, config
CONFIGS = {
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                 dict(_BASE, intermediate_size=128, rotary_pct=0.5, hidden_act="gelu")),
    # 4 experts, 2 per token: with 8 tokens every expert is routed to
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(_BASE, intermediate_size=32, num_key_value_heads=1, num_local_experts=4,
                     num_experts_per_tok=2)),
}
ENGINES = {"gpt_neox": "renamed_like", "mixtral": "vllm_like"}


@dataclass(frozen=True)
class ValuesCase:
    name: str
    family: str = "gpt_neox"
    dtype: str = "fp32"
    fault: dict | None = None
    mode: str = "statistics"

    def summary(self) -> str:
        """One line for ``make_real_dumps.py --list``."""
        return f"{self.family} hf vs {ENGINES[self.family]} {self.mode} {self.dtype}"


CASES = {c.name: c for c in [
    ValuesCase("neox_renamed_fp32_clean"),
    ValuesCase("neox_renamed_bf16_clean", dtype="bf16"),
    ValuesCase("neox_renamed_fp32_stale_fc_out", fault=fault(
        "rollout", "stale_weight", "backbone.blocks.1.ffn.fc_out",
        "rollout kept layer 1 fc_out.weight (transformers: mlp.dense_4h_to_h) of the previous step",
        param="gpt_neox.layers.1.mlp.dense_4h_to_h.weight", layer=1,
        train_modules=["gpt_neox.layers.1.mlp.dense_4h_to_h"],
        rollout_modules=["backbone.blocks.1.ffn.fc_out"])),
    ValuesCase("neox_renamed_bf16_stale_fc_out", dtype="bf16", fault=fault(
        "rollout", "stale_weight", "backbone.blocks.1.ffn.fc_out",
        "rollout kept layer 1 fc_out.weight (transformers: mlp.dense_4h_to_h) of the previous step",
        param="gpt_neox.layers.1.mlp.dense_4h_to_h.weight", layer=1,
        train_modules=["gpt_neox.layers.1.mlp.dense_4h_to_h"],
        rollout_modules=["backbone.blocks.1.ffn.fc_out"])),
    ValuesCase("neox_renamed_fp32_stale_dense_train", fault=fault(
        "train", "stale_weight", "gpt_neox.layers.0.attention.dense",
        "train side restored layer 0 attention.dense.weight from an older checkpoint",
        param="gpt_neox.layers.0.attention.dense.weight", layer=0,
        train_modules=["gpt_neox.layers.0.attention.dense"],
        rollout_modules=["backbone.blocks.0.mixer.proj"])),
    ValuesCase("mixtral_tp1_fp32_clean", family="mixtral"),
    ValuesCase("mixtral_tp1_fp32_stale_experts", family="mixtral", fault=fault(
        "rollout", "stale_weight", "model.layers.1.block_sparse_moe.experts",
        "rollout kept layer 1 experts' down weights (FusedMoE w2_weight) of the previous step",
        param="model.layers.1.mlp.experts.down_proj", layer=1,
        train_modules=["model.layers.1.mlp.experts"],
        rollout_modules=["model.layers.1.block_sparse_moe.experts"])),
]}


def _dtype(case):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16}[case.dtype]


def hf_model(family):
    """The seeded transformers model both sides load (fp32), as families.hf_model seeds weights."""
    import torch
    import transformers

    cfg_name, model_name, kwargs = CONFIGS[family]
    torch.manual_seed(2000 + sorted(CONFIGS).index(family))
    model = getattr(transformers, model_name)(getattr(transformers, cfg_name)(**kwargs)).eval()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # LayerNorm weights and biases away from 1 and 0, so a wrong one shows
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            else:  # 0.1 keeps activations O(1) through 2 layers
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def _state(case, side):
    from .sides import stale

    state = hf_model(case.family).state_dict()
    f = case.fault
    return stale(state, f["param"]) if f and f["side"] == side else state


def _prompt():
    import torch

    return torch.randint(3, _BASE["vocab_size"], (PROMPT_LEN,), generator=torch.Generator().manual_seed(42))


def _rollout_model(case, state):
    from . import mixtral_like, renamed_like

    build = {"gpt_neox": renamed_like.build, "mixtral": mixtral_like.build}[case.family]
    model = build(hf_model(case.family).config, _dtype(case))
    model.load_weights(state)
    return model


def _rollout(case, out, scratch):
    import torch

    from . import msprobe_run, vllm_like
    from .sides import Capture

    runs = {}
    for run, state in (("dumped", _state(case, "rollout")), ("clean", hf_model(case.family).state_dict())):
        model = _rollout_model(case, state)
        cap = Capture(model)
        scope = msprobe_run.Probe(out, case.mode).step_scope(model) if run == "dumped" else None
        vllm_like.generate(model, _prompt().tolist(), 1, scope)  # the prefill, one token sampled
        runs[run] = cap.stop()
    torch.save(runs, Path(scratch) / "rollout.pt")


def _train(case, out, scratch):
    import torch

    from . import msprobe_run
    from .sides import Capture

    runs = {}
    for run, state in (("dumped", _state(case, "train")), ("clean", hf_model(case.family).state_dict())):
        model = hf_model(case.family)
        model.load_state_dict(state)
        model = model.to(_dtype(case))
        cap = Capture(model)
        ids = _prompt()[None]
        if run == "dumped":
            msprobe_run.Probe(out, case.mode).forward(model, lambda: model(input_ids=ids))
        else:
            with torch.no_grad():
                model(input_ids=ids)
        runs[run] = cap.stop()
    torch.save(runs, Path(scratch) / "train.pt")


def _rel(a, b):
    import torch

    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    return float(torch.linalg.norm(a - b) / max(float(torch.linalg.norm(b)), 1e-30))


# Mixtral outputs that mean the same tensor in transformers and vLLM (norms: the normed output).
_MIXTRAL_SAME = ("embed_tokens", "input_layernorm", "post_attention_layernorm", "self_attn", "o_proj",
                 "block_sparse_moe", "gate", "experts", "model.norm")


def _aligned(family, rollout_modules) -> dict[str, str]:
    """rollout module -> the transformers module carrying the same output."""
    if family == "gpt_neox":
        from .renamed_like import hf_names

        return hf_names(_BASE["num_hidden_layers"])
    return {m: m.replace("block_sparse_moe", "mlp") for m in rollout_modules if m.endswith(_MIXTRAL_SAME)}


def measure(case, scratch):
    """Largest clean train-vs-rollout difference over the modules ``_aligned`` pairs, and the
    fault's signal at its module (faulty against clean run of the same side)."""
    import torch

    train = torch.load(Path(scratch) / "train.pt")
    rollout = torch.load(Path(scratch) / "rollout.pt")
    noise, where = 0.0, None
    for ours, theirs in _aligned(case.family, rollout["clean"]).items():
        t, r = train["clean"].get(theirs), rollout["clean"].get(ours)
        if t is None or r is None or t.numel() != r.numel():
            continue  # the logits: the rollout computes the last row only
        e = _rel(r, t)
        if e >= noise:
            noise, where = e, theirs
    out = {"noise": noise, "noise_module": where}
    f = case.fault
    if f is None:
        return out
    caps = train if f["side"] == "train" else rollout
    signal = _rel(caps["dumped"][f["target"]], caps["clean"][f["target"]])
    return {**out, "module": f["target"], "rank": None, "rel_error": signal,
            "ratio": signal / noise if noise else float("inf")}


def describe(case, measured):
    """The case.json document (corpus schema 1)."""
    f = case.fault
    expected = dict(CLEAN_EXPECTED)
    if f is not None:
        check_signal(case.name, f, measured)
        expected = {"verdict": "root_cause_found", "category": "parameter_or_checkpoint_issue", "side": None,
                    "train_modules": f["train_modules"], "rollout_modules": f["rollout_modules"],
                    "layer": f["layer"]}
    return {
        "schema": 1, "case": case.name, "family": case.family, "mode": case.mode,
        "dtype": {"train": case.dtype, "rollout": case.dtype},
        "train": {"engine": "transformers", "tp": 1, "layout": "hf",
                  "notes": f"{CONFIGS[case.family][1]}, one forward of the 8-token prompt"},
        "rollout": {"engine": ENGINES[case.family], "tp": 1, "steps": 1,
                    "notes": "prefill only (step0); " + _NOTES[case.family]},
        "fault": None if f is None else {k: f[k] for k in ("side", "kind", "target", "rank", "detail")},
        "expected": expected,
        "measured": measured,
    }


_NOTES = {"gpt_neox": "tools/real_dumps/renamed_like.py: the same computation under a module tree no naming "
                      "profile describes",
          "mixtral": "tools/real_dumps/mixtral_like.py: vLLM's Mixtral tree (block_sparse_moe, FusedMoE)"}


def _round(x):
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def make_case(case, root):
    """Write ``root/<case.name>/`` (train/, rollout/, case.json); returns the case.json document."""
    from . import msprobe_run

    dest = Path(root) / case.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as scratch:
        msprobe_run.run_ranks(_rollout, 1, case, str(dest / "rollout"), scratch)
        msprobe_run.run_ranks(_train, 0, case, str(dest / "train"), scratch)
        msprobe_run.stable_proc_names(dest / "train")
        doc = _round(describe(case, measure(case, scratch)))
    (dest / "case.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc
