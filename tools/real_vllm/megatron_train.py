"""The train side of a real-vLLM case as a megatron-core job: the committed HF Llama checkpoint
converted into a megatron-core 0.16 ``GPTModel`` (local spec, TP 1, fp32, CPU) by
``tools/real_dumps/megatron_side.py``, one forward over prompt + response under msprobe.

Writes what dump_trainer.py writes (``OUT/train/``, ``OUT/train_logprobs.jsonl``,
``OUT/msprobe_train.json``). Needs megatron-core importable (generate.py puts
``--megatron-path`` on PYTHONPATH) besides the vLLM environment. Run by generate.py:

    python tools/real_vllm/megatron_train.py --model DIR --tokens tokens.json --out OUT
        [--temperature T] [--task statistics]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "rl-consistency-analysis" / "scripts"))
sys.path.insert(0, str(ROOT / "tools"))

from dumping import logprob_jsonl, msprobe_config, token_ids  # noqa: E402


def _hf_config(model_dir):
    """The megatron_side.HF_CONFIG values of the checkpoint in ``model_dir``."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings")
    heads = cfg["num_attention_heads"]
    if cfg.get("head_dim", cfg["hidden_size"] // heads) * heads != cfg["hidden_size"]:
        raise SystemExit("megatron_side builds kv_channels = hidden / heads: head_dim must equal it")
    return {**{k: cfg[k] for k in keys}, "rope_theta": float(rope)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--task", default="statistics")
    ap.add_argument("--dtype", default="fp32", choices=["fp32"])
    ap.add_argument("--layers")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as tdist
    from msprobe.pytorch import PrecisionDebugger
    from safetensors.torch import load_file

    from real_dumps import megatron_side as ms

    ms.HF_CONFIG.update(_hf_config(args.model))
    state = {k: v.float() for k, v in load_file(str(Path(args.model) / "model.safetensors")).items()}
    prompt, response = token_ids.read_tokens(args.tokens)
    out = Path(args.out)
    ids = torch.tensor([prompt + response])
    config = msprobe_config.write_config(out / "msprobe_train.json", out / "train", args.task, args.layers)
    layout = ms.Layout()
    with tempfile.TemporaryDirectory() as tmp:
        tdist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            ms.init_parallel(layout)
            model = ms.build_stage(layout, state)
            debugger = PrecisionDebugger(config_path=str(config))
            debugger.start(model=model)
            try:
                logits = ms.stage_forward(layout, model, ids)
            finally:
                debugger.stop()
                debugger.step()
        finally:
            from megatron.core import parallel_state

            parallel_state.destroy_model_parallel()
            tdist.destroy_process_group()
    rows = logits[0, len(prompt) - 1:len(prompt) - 1 + len(response)].float()
    if args.temperature > 0:
        rows = rows / args.temperature
    logp = torch.log_softmax(rows, dim=-1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1).tolist()
    rec = logprob_jsonl.record("seq0", response, logp, prompt_ids=prompt, dtype="float32",
                               temperature=args.temperature, logprobs_mode="processed_logprobs")
    logprob_jsonl.write(out / "train_logprobs.jsonl", [rec])
    print(f"wrote {out / 'train'} (megatron-core GPTModel, one forward over {len(prompt)} prompt + "
          f"{len(response)} response ids), train_logprobs.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
