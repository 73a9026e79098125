#!/usr/bin/env python3
"""The trainer side offline: transformers' forward over prompt + response, as RL trainers
recompute log-probs, with msprobe around it (see --help).

Writes ``OUT/train/`` (msprobe's tree, ``step0/rank0/``: the forward runs under a one-process gloo
group, as a distributed trainer's does), ``OUT/train_logprobs.jsonl`` (the generic log-prob
JSONL) and ``OUT/msprobe_train.json`` (the msprobe config used).

Public API: build_parser(), main(argv) -> exit code.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dumping import cli, logprob_jsonl, msprobe_config, token_ids  # noqa: E402


def build_parser():
    """Argument parser."""
    ap = argparse.ArgumentParser(
        prog="dump_trainer.py",
        description="Run the trainer's log-prob forward (transformers) over prompt + response with msprobe "
                    "attached: logits of the positions that predict the response tokens, divided by the "
                    "temperature, log-softmax; write the train dump and the log-probs.",
        epilog="Exit codes: 0 written; 2 bad option or input, or torch/transformers/msprobe missing. "
               "Needs: pip install torch transformers mindstudio-probe.")
    ap.add_argument("--model", required=True, help="Hugging Face model folder the trainer loads")
    ap.add_argument("--tokens", required=True, help='tokens.json: {"prompt_ids": [...], "response_ids": [...]}')
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="the job's rollout temperature the trainer divides the logits by (default 1)")
    cli.add_dump_options(ap)
    ap.add_argument("--out", required=True, help="output folder (may be the one dump_vllm.py wrote)")
    return ap


def _logprobs(logits, prompt_len, response, temperature):
    """The sampled tokens' log-probs: row t of the logits predicts token t+1."""
    import torch

    rows = logits[0, prompt_len - 1:prompt_len - 1 + len(response)].float()
    if temperature > 0:
        rows = rows / temperature
    logp = torch.log_softmax(rows, dim=-1)
    return logp.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1).tolist()


def _forward(args, prompt, response, out):
    import torch
    import torch.distributed as tdist
    import transformers
    from msprobe.pytorch import PrecisionDebugger

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(args.model), dtype=getattr(torch, cli.DTYPES[args.dtype])).eval()
    vocab = model.config.vocab_size
    bad = [t for t in prompt + response if t >= vocab]
    if bad:
        raise cli.InputError(f"{args.tokens}: token id {bad[0]} is outside the model's vocabulary ({vocab})")
    config = msprobe_config.write_config(out / "msprobe_train.json", out / "train", args.task, args.layers)
    with tempfile.TemporaryDirectory() as tmp:
        tdist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            debugger = PrecisionDebugger(config_path=str(config))
            debugger.start(model=model)
            try:
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([prompt + response])).logits
            finally:
                debugger.stop()
                debugger.step()
        finally:
            tdist.destroy_process_group()
    return _logprobs(logits, len(prompt), response, args.temperature)


def _main(argv):
    args = build_parser().parse_args(argv)
    cli.model_dir(args.model)
    prompt, response = token_ids.read_tokens(args.tokens)
    if args.temperature < 0:
        raise cli.InputError("--temperature must be >= 0")
    out = Path(args.out)
    cli.out_subdir(out, "train")
    cli.require(("torch", "transformers", "msprobe.pytorch"), "torch, transformers and msprobe",
                "torch transformers mindstudio-probe")
    out.mkdir(parents=True, exist_ok=True)
    logprobs = _forward(args, prompt, response, out)
    rec = logprob_jsonl.record("seq0", response, logprobs, prompt_ids=prompt, dtype=cli.DTYPES[args.dtype],
                               temperature=args.temperature, logprobs_mode="processed_logprobs")
    logprob_jsonl.write(out / "train_logprobs.jsonl", [rec])
    print(f"wrote {out / 'train'} (one forward over {len(prompt)} prompt + {len(response)} response ids), "
          "train_logprobs.jsonl")
    return 0


def main(argv=None):
    """Entry point; returns the exit code."""
    return cli.run(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
