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
    make_case(case, root) -> dict   make_real_dumps.make_case, with ``rollout.ep`` in case.json and
                            the token ids both engines ran in tokens.json (what ``--token-ids`` reads)

A statistics dump of a prefill cannot give its token ids back (their order is lost), and a stale
expert in bf16 moves the statistics of its layer's output less than the engines' rounding does, so
the fault is found only against the checkpoint's forward, which needs the ids a user holds:
tokens.json is ``{"prompt_ids": [...], "response_ids": []}`` (prefill only: the one sampled token is
consumed by no dumped forward).

Faults: a ``stale_weight`` on one expert of one rank (layer 0 global expert 3, rank 1's local expert 1).
"""
from __future__ import annotations

import json

from .cases import fault
from .cases_moe import MoeCase

# What the default command (no --model) must say on a faulty case (case.json ``expected_without_model``):
# ``expected`` (from the fault) needs the checkpoint's forward here; without it the dumps show the
# drift only downstream of the faulty experts' layer, as a divergence carried in (not an origin),
# never an all-clear.
WHY_WITHOUT_MODEL = ("bf16 statistics of the experts' output move within the statistics tolerance (a stale expert "
                     "changes the rows routed to it, and Max/Min/Mean/Norm of the whole output barely); the MoERunner "
                     "holds no expert weight to compare")
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
    rollout's expert-parallel size and, for a faulty case, ``expected_without_model``; tokens.json
    holds the ids both engines ran."""
    import make_real_dumps  # the driver that imported this module

    from .families import prompt

    doc = make_real_dumps.make_case(case, root)
    doc["rollout"]["ep"] = case.rollout_tp
    doc["rollout"]["notes"] += f"; MoE layers expert-parallel over the {case.rollout_tp} ranks (whole experts per rank)"
    if case.fault is not None:
        doc["expected_without_model"] = {"verdict": "inconclusive", "first_divergence": {
            "status": "propagated", "after_layer": doc["expected"]["layer"]}, "why": WHY_WITHOUT_MODEL}
    (root / case.name / "case.json").write_text(json.dumps(doc, indent=1) + "\n")
    ids = {"prompt_ids": prompt(case.family, case.prompt_len, case.prompt_seed), "response_ids": []}
    (root / case.name / "tokens.json").write_text(json.dumps(ids) + "\n")
    return doc
