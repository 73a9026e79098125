"""Qwen3-MoE against a vLLM rollout with expert parallelism (``--enable-expert-parallel``).

The rollout runs TP=2 attention with the MoE layers expert-parallel over the same two ranks
(vLLM's EP group is the TP group when data parallelism is 1): each rank holds whole experts
(the ``MoERunner``'s never-called ``routed_experts``, ``w13_weight`` [E/2, 2I, H], in no dump
entry), routes every token and computes only its own experts; the runner all-reduces the partial
sums, so every rank's ``experts`` output is the full one (vLLM 0.32). The train side
is transformers' Qwen3-MoE on one process. tools/make_real_dumps.py finds this module (``--list``,
``--only NAME``).

Public API:
    CASES                   name -> cases_moe.MoeCase, in generation order
    make_case(case, root) -> dict   make_real_dumps.make_case, with ``rollout.ep`` in case.json

Faults: a ``stale_weight`` on one expert of one rank (layer 0 global expert 3, rank 1's local expert 1).
"""
from __future__ import annotations

import json

from .cases import fault
from .cases_moe import MoeCase

_BF16 = {"train": "bf16", "rollout": "bf16"}
_EP = {"rms_kernel": "fused", "expert_parallel": True}
_TP = 2  # vLLM: expert-parallel size = TP size x DP size (DP 1 here)

CASES = {c.name: c for c in [
    MoeCase("qwen3_moe_ep2_bf16_clean", family="qwen3_moe", rollout_tp=_TP, dtype=_BF16, rollout_opts=_EP),
    MoeCase("qwen3_moe_ep2_bf16_stale_expert_rollout", family="qwen3_moe", rollout_tp=_TP, dtype=_BF16,
            rollout_opts=_EP, fault=fault(
                "rollout", "stale_weight", "model.layers.0.mlp.experts",
                "rollout rank 1 kept layer 0 global expert 3's gate/up weights (its local expert 1) of the previous step",
                rank=1, param="model.layers.0.mlp.experts.gate_up_proj", expert=3)),
]}


def make_case(case, root):
    """Write ``root/<case.name>/`` as make_real_dumps.make_case does; case.json also says the
    rollout's expert-parallel size."""
    import make_real_dumps  # the driver that imported this module

    doc = make_real_dumps.make_case(case, root)
    doc["rollout"]["ep"] = case.rollout_tp
    doc["rollout"]["notes"] += f"; MoE layers expert-parallel over the {case.rollout_tp} ranks (whole experts per rank)"
    (root / case.name / "case.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc
