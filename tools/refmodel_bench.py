"""The reference forward's memory bound, for tools/bench.py (stage ``refmodel``; ``make bench-refmodel``).

``python tools/refmodel_bench.py --out DIR --size-mb 300`` writes a random bf16 Llama checkpoint
(streamed to disk, one tensor at a time) and prints its sizes as JSON; bench.py runs it in a
subprocess (a child's peak-memory record starts from its parent's), then runs two subprocesses on it: the baseline (imports and the safetensors
headers only) and the numpy forward over ``tokens`` tokens, every module output consumed. The
forward streams weights one module at a time, so its peak memory over the baseline should be
about one layer's weights in float32 (twice their bf16 bytes) plus the activations, whatever the
number of layers.
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "dump-module-mapping-value-compare" / "scripts"
# hidden 1024, 16 heads of 64 (4 KV heads), MLP 2816, vocab 32000: one layer is 22.5 MB in bf16,
# the embedding and the untied head 65.5 MB each.
CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 1024,
          "intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
          "vocab_size": 32000, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
          "tie_word_embeddings": False, "max_position_embeddings": 4096}

BASELINE = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from dumpcompare import checkpoint
from dumpcompare.refmodel import forward
checkpoint.load(sys.argv[2])
"""
FORWARD = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from dumpcompare import checkpoint
from dumpcompare.refmodel import forward
ck = checkpoint.load(sys.argv[2])
ids = np.arange(int(sys.argv[3])) * 7919 % ck.config["vocab_size"]
n = 0
for out in forward(ck, ck.config, ids, dtype=sys.argv[4]):
    n += 1
    float(np.linalg.norm(out.array))    # what a statistics dump computes per module
print(n)
"""


def _shapes(cfg: dict, layers: int) -> dict[str, tuple[int, ...]]:
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    out = {"model.embed_tokens.weight": (cfg["vocab_size"], h)}
    for n in range(layers):
        p = f"model.layers.{n}."
        out.update({p + "input_layernorm.weight": (h,), p + "self_attn.q_proj.weight": (q, h),
                    p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.v_proj.weight": (kv, h),
                    p + "self_attn.o_proj.weight": (h, q), p + "post_attention_layernorm.weight": (h,),
                    p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                    p + "mlp.down_proj.weight": (h, i)})
    out.update({"model.norm.weight": (h,), "lm_head.weight": (cfg["vocab_size"], h)})
    return out


def layers_for(size_mb: float) -> int:
    """Decoder layers that bring the checkpoint to about ``size_mb`` (at least 2)."""
    shapes = _shapes(CONFIG, 1)
    fixed = 2 * 2 * shapes["model.embed_tokens.weight"][0] * CONFIG["hidden_size"]   # embedding and head
    per_layer = 2 * sum(int(np.prod(s)) for n, s in shapes.items() if ".layers." in n)
    return max(2, round((size_mb * 1e6 - fixed) / per_layer))


def write_checkpoint(folder: Path, size_mb: float, seed: int = 0) -> dict:
    """A random bf16 Llama checkpoint in ``folder``; returns its sizes (file, largest layer)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    from dumpcompare.tensorio import bfloat16_bits

    folder.mkdir(parents=True, exist_ok=True)
    layers = layers_for(size_mb)
    shapes = _shapes(CONFIG, layers)
    header, off = {}, 0
    for name, shape in shapes.items():
        n = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header).encode()
    rng = np.random.default_rng(seed)
    path = folder / "model.safetensors"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text)
        for name, shape in shapes.items():
            scale = 1.0 if name.endswith("norm.weight") else 0.02
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
            if name.endswith("norm.weight"):
                a += 1.0
            fh.write(bfloat16_bits(a).astype("<u2").tobytes())
    (folder / "config.json").write_text(json.dumps({**CONFIG, "num_hidden_layers": layers}))
    layer_bytes = max(sum(2 * int(np.prod(s)) for n, s in shapes.items() if n.startswith(f"model.layers.{k}."))
                      for k in range(layers))
    return {"file_bytes": path.stat().st_size, "layers": layers, "largest_layer_bytes": layer_bytes,
            "head_bytes": 2 * int(np.prod(shapes["lm_head.weight"]))}


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Write a random bf16 Llama checkpoint; print its sizes as JSON.")
    ap.add_argument("--out", required=True, help="model folder to write")
    ap.add_argument("--size-mb", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(json.dumps(write_checkpoint(Path(args.out), args.size_mb, args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
