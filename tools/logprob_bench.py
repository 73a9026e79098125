"""The log-prob triage stage of ``make bench`` (issue 24): 10^6 tokens triaged against the time it
takes only to read the same files (``np.load`` of every array for ``.npz``, ``json.loads`` of every
line for the generic JSONL), in the same run.

``write_pair`` makes one rollout/train pair per format from the same numbers: precision-like scatter
(normal, scale 0.01 nat) on log-probs drawn as a real model's are (most near 0, a long tail). The
bench runs each command as its own process, so a ratio includes Python start-up on both sides.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

NPZ_LOAD = ("import sys, numpy as np\nfor p in sys.argv[1:]:\n    with np.load(p, allow_pickle=False) as z:\n"
            "        [z[k] for k in z.files]\n")
JSONL_LOADS = ("import json, sys\nfor p in sys.argv[1:]:\n    with open(p, encoding='utf-8') as f:\n"
               "        [json.loads(line) for line in f]\n")


def write_pair(folder: Path, tokens: int, seq_len: int = 250, seed: int = 0) -> dict:
    """Write rollout/train files of ``tokens`` response tokens in both formats; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    b = max(1, tokens // seq_len)
    lp_r = -rng.exponential(0.6, (b, seq_len))
    lp_t = lp_r + rng.normal(0.0, 0.01, (b, seq_len))
    ids = rng.integers(0, 150_000, (b, seq_len))
    mask = np.ones((b, seq_len), np.int8)
    paths = {}
    for side, key, lp in (("rollout", "rollout_log_probs", lp_r), ("train", "old_log_probs", lp_t)):
        npz = folder / f"{side}.npz"
        np.savez(npz, **{key: lp.astype(np.float32), "responses": ids, "response_mask": mask})
        jsonl = folder / f"{side}.jsonl"
        with open(jsonl, "w", encoding="utf-8") as f:
            for i in range(b):
                f.write(json.dumps({"id": i, "token_ids": ids[i].tolist(),
                                    "logprobs": lp[i].astype(np.float32).tolist(), "dtype": "bf16"}) + "\n")
        paths[side] = {"npz": str(npz), "jsonl": str(jsonl)}
    return {"tokens": b * seq_len, "sequences": b, **paths}
