"""Write a real msprobe tensor-mode pair and torch's own per-token log-prob difference for it.

Not used by the tests (they read what this wrote, committed under
tests/data/msprobe/llama_L0_tensor_logprob/); rerun it to regenerate. Needs torch (CPU),
mindstudio-probe and transformers (e.g. /work/toolenv).

    python tools/make_msprobe_logprob.py OUT      # OUT/{train,rollout}/step0/proc*/, OUT/expected.json

Both sides run the same tiny Llama on the same tokens, dumped with the config that
rl-consistency-analysis/scripts/make_dump_config.py writes (L0, tensor, forward only, layer 1 plus
the embedding, final norm and lm_head: the scope keeps the files small); the rollout
copy has layer 1's down_proj weight scaled by 1.02. ``expected.json`` holds the log-prob
difference computed by torch from the models' own logits, which the compare step must reproduce
from the dumped tensors alone.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG_SCRIPT = ROOT / "rl-consistency-analysis" / "scripts" / "make_dump_config.py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder to (re)create")
    ap.add_argument("--tokens", type=int, default=12)
    args = ap.parse_args()
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for side in ("train", "rollout"):
        subprocess.run([sys.executable, str(CONFIG_SCRIPT), "--out", str(out / f"{side}_config.json"),
                        "--dump-path", str(out / side), "--task", "tensor", "--layers", "1"], check=True)

    import torch
    from msprobe.pytorch import PrecisionDebugger
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      attn_implementation="eager")
    train = LlamaForCausalLM(cfg).eval()
    rollout = LlamaForCausalLM(cfg).eval()
    rollout.load_state_dict(train.state_dict())
    with torch.no_grad():
        rollout.model.layers[1].mlp.down_proj.weight.mul_(1.02)
    ids = torch.randint(0, cfg.vocab_size, (1, args.tokens))
    logprobs = []
    for side, model in (("train", train), ("rollout", rollout)):
        debugger = PrecisionDebugger(config_path=str(out / f"{side}_config.json"))
        debugger.start(model=model)
        try:
            with torch.no_grad():
                logits = model(input_ids=ids).logits.double()
        finally:
            debugger.stop()
            debugger.step()
        PrecisionDebugger._instance = None      # a second debugger with its own config
        logprobs.append(torch.log_softmax(logits[0, :-1], -1).gather(1, ids[0, 1:, None])[:, 0])
        (out / f"{side}_config.json").unlink()
    diff = (logprobs[1] - logprobs[0]).abs()
    expected = {"positions": int(diff.numel()), "mean_abs_diff": diff.mean().item(),
                "max_abs_diff": diff.max().item(), "max_at_position": int(diff.argmax()) + 1,
                "abs_diff": diff.tolist()}
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    for stale in out.glob("*/step0/*/stack.json"):
        stale.unlink()              # call stacks name this machine's paths and are not read
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
