"""Record what transformers computes for each family's tiny checkpoint (a developer tool).

The numpy reference forward (dumpcompare.refmodel) is tested against these recordings without
torch. For every family the tool runs the transformers model on a few token ids, with a forward
hook on every module, once in float32 and once cast to bfloat16, and writes

    tests/data/refmodel/<family>.npz    ids, positions, config, model, modules (hook order),
                                        fp32_<i> and bf16_<i> outputs

and the same for a few config variants of a family's checkpoint (VARIANTS: rope scalings at
positions past their original context, partial rotary).

The checkpoints are tests/data/real/_models/<family>/ (tools/make_real_dumps.py); families that
have none there (gemma3, mixtral) get a tiny seeded one written to
tests/data/refmodel/_models/<family>/ first. Needs torch and transformers (/work/toolenv/bin/python).

    python tools/make_refmodel_fixtures.py                 # every family
    python tools/make_refmodel_fixtures.py --only gemma3
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
REAL_MODELS = ROOT / "tests" / "data" / "real" / "_models"
OUT = ROOT / "tests" / "data" / "refmodel"
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen3_moe", "mixtral")
# Recordings of a family's checkpoint under another config: name -> (family, config keys, first position).
# The rope scalings act on positions past original_max_position_embeddings, hence the offsets.
VARIANTS = {
    "llama_rope_llama3": ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 16}}, 40),
    "qwen2_rope_linear": ("qwen2", {"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0}}, 20),
    "phi3_partial_rotary": ("phi3", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                         "partial_rotary_factor": 0.5}}, 0),
}
# Token ids of every recording: 8 tokens, more than the sliding windows (4) of the tiny models.
IDS = (5, 17, 42, 99, 3, 250, 7, 128)
_TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False)
# Families without a checkpoint in the real corpus: (config class, model class, config kwargs).
EXTRA = {
    # sliding layer 0 with its own rope base, full layer 1; q/k norms and four norms per layer
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 4, "num_key_value_heads": 2,
                "layer_types": ["sliding_attention", "full_attention"], "tie_word_embeddings": True,
                "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                    "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
    # 4 experts, 2 per token, per-expert w1/w2/w3 in the file; sliding window 4
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32, "sliding_window": 4}),
}


def _tiny_model(family: str, dest: Path) -> None:
    import torch
    import transformers

    cfg_name, model_name, extra = EXTRA[family]
    cfg = getattr(transformers, cfg_name)(**{**_TINY, **extra})
    torch.manual_seed(2000 + sorted(EXTRA).index(family))
    model = getattr(transformers, model_name)(cfg).eval()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():   # values O(1) through two layers; Gemma's norm weights away from 0 (1 + w)
        for p in model.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    if dest.exists():
        shutil.rmtree(dest)
    model.save_pretrained(dest, safe_serialization=True)


def _record(model, ids, positions, heads_first: bool) -> tuple[list[str], list[np.ndarray]]:
    """Every hooked module's output.0 as [tokens, features]. ``heads_first``: the family's q/k
    norms run on [batch, heads, tokens, head_dim] (Gemma 3 norms after the transpose)."""
    import torch

    names, arrays, handles = [], [], []

    def hook(name):
        def fn(_mod, _inp, out):
            o = (out[0] if isinstance(out, tuple) else out).detach().float().numpy()
            if heads_first and o.ndim == 4:
                o = o.transpose(0, 2, 1, 3)
            names.append(name)
            arrays.append(o.reshape(len(ids), -1))
        return fn

    for name, mod in model.named_modules():
        # the model shells, dropouts, and the activation inside the stacked experts (called once
        # per expert on that expert's tokens) are not modules the reference yields
        if name in ("", "model", "model.layers") or name.endswith("dropout") or ".experts.act_fn" in name:
            continue
        handles.append(mod.register_forward_hook(hook(name)))
    with torch.no_grad():
        model(torch.tensor(ids)[None], position_ids=torch.tensor(positions)[None])
    for h in handles:
        h.remove()
    return names, arrays


def make(name: str) -> Path:
    import torch
    import transformers

    family, overrides, first = VARIANTS.get(name, (name, {}, 0))
    folder = REAL_MODELS / family
    if family in EXTRA:
        folder = OUT / "_models" / family
        _tiny_model(family, folder)
    config = {**json.loads((folder / "config.json").read_text()), **overrides}
    positions = list(range(first, first + len(IDS)))
    recorded = []
    # Loaded in bf16 (not cast after loading, which would round the rotary inverse frequencies too).
    for dtype in (torch.float32, torch.bfloat16):
        cfg = transformers.AutoConfig.from_pretrained(folder, **overrides)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, config=cfg, attn_implementation="eager",
                                                                  dtype=dtype).eval()
        recorded.append(_record(model, IDS, positions, family == "gemma3"))
    (names, fp32), (bf16_names, bf16) = recorded
    assert names == bf16_names
    out = OUT / f"{name}.npz"
    np.savez_compressed(out, ids=np.array(IDS, dtype=np.int64), positions=np.array(positions, dtype=np.int64),
                        modules=np.array(names), model=np.array(str(folder.relative_to(ROOT))),
                        config=np.array(json.dumps(config)),
                        **{f"fp32_{i:03d}": a for i, a in enumerate(fp32)},
                        **{f"bf16_{i:03d}": a for i, a in enumerate(bf16)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=FAMILIES + tuple(VARIANTS),
                    help="families or variants to record (default: all)")
    args = ap.parse_args(argv)
    torch_threads()
    OUT.mkdir(parents=True, exist_ok=True)
    for fam in args.only or FAMILIES + tuple(VARIANTS):
        path = make(fam)
        print(f"{fam}: {path.relative_to(ROOT)} ({path.stat().st_size} bytes)")
    return 0


def torch_threads() -> None:
    """One CPU thread: the recordings are then the same on every run."""
    import torch

    torch.set_num_threads(1)


if __name__ == "__main__":
    raise SystemExit(main())
