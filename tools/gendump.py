"""A generation pair in real-vLLM shape, for tools/bench.py (stage ``generation``).

``python tools/gendump.py --out DIR --prompt 32 --decode 256`` runs the synthetic numpy Llama of
``tests/synth`` once per side over prompt + response (``P + D`` tokens) and writes:

* ``DIR/train/step0/rank0``: the trainer's one forward over all ``P + D`` tokens (HF layout,
  autograd on), every module once (``...forward.0``);
* ``DIR/rollout_decode/step0/rank0``: vLLM's prefill over the ``P`` prompt tokens and one decode
  call per later token, all in one msprobe step (``...forward.0`` .. ``...forward.D``), the
  rotary module shared by every layer: its calls numbered ``call * layers + layer`` under
  ``model.layers.0.self_attn.rotary_emb``, construct.json naming each call's calling layer, as
  a real vLLM dump has it (tests/data/real_vllm/*/rollout/step0/rank0);
* ``DIR/rollout_prefill/step0/rank0``: the same engine's single forward over all ``P + D``
  tokens (one call, same shared-rotary numbering);
* ``DIR/model``: the weights as a safetensors checkpoint (float32, or bfloat16 with ``--dtype
  bf16``) with a Llama config.json, which ``--model`` reads (the dumps' statistics are the
  checkpoint's own forward, so nothing departs);
* ``DIR/tokens.json``: the ``P + D`` token ids (``--token-ids``).

With a KV cache each token's activations are the same in the prefill or in a later decode call
(attention is causal), so each call's statistics are those of its rows of the one forward. The
engine's entries are cut into calls as they finish (synth.stream): memory holds the weights, one
module's activations and the dumps' text (a Qwen3-0.6B shape, 28 layers, hidden 1024, vocab
32000, fits in about 2 GB).

Prints a JSON summary (paths, bytes, calls, shape) on its last stdout line.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
ROTARY = "self_attn.rotary_emb.RotaryEmbedding.forward."


def _cfg(args):
    import synth
    heads = args.heads or max(1, args.hidden // args.head_dim)
    return synth.Config(vocab=args.vocab, hidden=args.hidden, intermediate=args.intermediate or 2 * args.hidden,
                        layers=args.layers, heads=heads, kv_heads=args.kv_heads or max(1, heads // 2),
                        head_dim=args.head_dim, seq_len=args.prompt + args.decode, seed=args.seed)


def call_key(key: str, n: int) -> str:
    """Call ``n``'s key of a module whose key in the forward is ``key``."""
    return f"{key.rsplit('.', 1)[0]}.{n}"


def shared_rotary(key: str, layers: int) -> str:
    """vLLM's one rotary module object: layer i's rotary call of forward call n is call
    ``n * layers + i`` of ``model.layers.0.self_attn.rotary_emb`` (its parent stays layer i's
    attention); any other key is unchanged."""
    if ROTARY not in key:
        return key
    head, call = key.rsplit(".", 1)
    layer = int(head.split("model.layers.", 1)[1].split(".", 1)[0])
    return f"Module.model.layers.0.{ROTARY}{int(call) * layers + layer}"


def write_checkpoint(folder: Path, cfg, weights, dtype: str = "fp32") -> Path:
    """The synth weights as an HF Llama checkpoint (safetensors + config.json), in float32 or in
    bfloat16 (rounded to nearest even: the values a bf16 side computes with)."""
    from synth.model import to_bf16
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {"model.embed_tokens.weight": weights.embed}
    for i, lw in enumerate(weights.layers):
        p = f"model.layers.{i}."
        tensors.update({p + "input_layernorm.weight": lw.input_norm, p + "self_attn.q_proj.weight": lw.q,
                        p + "self_attn.k_proj.weight": lw.k, p + "self_attn.v_proj.weight": lw.v,
                        p + "self_attn.o_proj.weight": lw.o, p + "post_attention_layernorm.weight": lw.post_norm,
                        p + "mlp.gate_proj.weight": lw.gate, p + "mlp.up_proj.weight": lw.up,
                        p + "mlp.down_proj.weight": lw.down})
    tensors.update({"model.norm.weight": weights.final_norm, "lm_head.weight": weights.lm_head})
    size, name = (2, "BF16") if dtype == "bf16" else (4, "F32")
    header, off = {}, 0
    for key, a in tensors.items():
        n = a.size * size
        header[key] = {"dtype": name, "shape": list(a.shape), "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(folder / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text)
        for a in tensors.values():
            if dtype == "bf16":     # a rounded float32's upper half is its bfloat16
                fh.write((to_bf16(a).view("<u4") >> 16).astype("<u2").tobytes())
            else:
                fh.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": cfg.hidden,
              "intermediate_size": cfg.intermediate, "num_hidden_layers": cfg.layers,
              "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
              "vocab_size": cfg.vocab, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
              "hidden_act": cfg.act, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
              "max_position_embeddings": max(4096, cfg.seq_len),
              "torch_dtype": "bfloat16" if dtype == "bf16" else "float32"}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def write_generation(out: Path, args) -> dict:
    """Write the pair, the checkpoint and the token ids under ``out``; return the summary."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import synth
    from synth.stream import CallDump

    cfg = _cfg(args)
    weights = synth.init_weights(cfg)
    out = Path(out)
    dirs = {"train": out / "train" / "step0" / "rank0", "rollout_decode": out / "rollout_decode" / "step0" / "rank0",
            "rollout_prefill": out / "rollout_prefill" / "step0" / "rank0"}
    tokens, layers = cfg.seq_len, cfg.layers

    def precision(side: str) -> tuple:
        return (synth.HalfPrecision(side),) if args.dtype == "bf16" else ()

    train = CallDump(dirs["train"], tokens, [(0, tokens)], lambda key, _n: key)
    synth.run_side(cfg, "hf", precision("train"), grad=True, weights=weights, sink=train.add)
    train.write()
    del train                       # its text
    spans = [(0, args.prompt)] + [(t, t + 1) for t in range(args.prompt, tokens)]
    decode = CallDump(dirs["rollout_decode"], tokens, spans, lambda key, n: shared_rotary(call_key(key, n), layers))
    prefill = CallDump(dirs["rollout_prefill"], tokens, [(0, tokens)], lambda key, _n: shared_rotary(key, layers))

    def both(entry) -> None:
        decode.add(entry)
        prefill.add(entry)

    synth.run_side(cfg, "vllm", precision("rollout"), weights=weights, sink=both)
    decode.write()
    prefill.write()
    model = write_checkpoint(out / "model", cfg, weights, args.dtype)
    ids = out / "tokens.json"
    ids.write_text(json.dumps([int(t) for t in synth.make_tokens(cfg)]))
    files = {k: str(d / "dump.json") for k, d in dirs.items()}
    return {"train": str(out / "train"), "rollout_decode": str(out / "rollout_decode"),
            "rollout_prefill": str(out / "rollout_prefill"), "model": str(model), "tokens": str(ids),
            "files": files, "bytes": {k: Path(f).stat().st_size for k, f in files.items()},
            "prompt": args.prompt, "decode": args.decode, "calls": 1 + args.decode, "layers": cfg.layers,
            "hidden": cfg.hidden, "intermediate": cfg.intermediate, "heads": cfg.heads, "kv_heads": cfg.kv_heads,
            "head_dim": cfg.head_dim, "vocab": cfg.vocab, "dtype": args.dtype,
            "model_bytes": (model / "model.safetensors").stat().st_size, "entries_per_call": prefill.modules}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Write a trainer / vLLM prefill+decode generation pair and its checkpoint.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens (the prefill call)")
    ap.add_argument("--decode", type=int, default=256, help="decode calls (one token each)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=None, help="MLP width (default 2 x hidden)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=None, help="attention heads (default hidden / head-dim)")
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default heads / 2)")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                    help="both sides' precision and the checkpoint's (default fp32)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if min(args.prompt, args.decode, args.layers, args.hidden, args.vocab) < 1:
        sys.exit("gendump: sizes must be positive")
    print(json.dumps(write_generation(Path(args.out), args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
