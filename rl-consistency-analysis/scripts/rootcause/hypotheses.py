"""Hypotheses (each with what would confirm or refute it) and next checks, per finding.

Kept as data keyed by category and module role so the reasoning stays reviewable; the
placeholders name the modules and parameters of the finding at hand.
"""
from __future__ import annotations

from .evidence import Vocabulary

# role -> config keys worth reading on both sides
CONFIG_KEYS = {
    "input_norm": ["rms_norm_eps", "layernorm_epsilon", "layer_norm_eps", "norm dtype / fp32 residual settings"],
    "post_norm": ["rms_norm_eps", "layernorm_epsilon", "layer_norm_eps", "norm dtype / fp32 residual settings"],
    "final_norm": ["rms_norm_eps", "layernorm_epsilon", "final norm dtype"],
    "q_norm": ["rms_norm_eps", "qk_layernorm"], "k_norm": ["rms_norm_eps", "qk_layernorm"],
    "act": ["hidden_act", "activation_func", "gated_linear_unit / swiglu", "approximate (gelu tanh vs exact)"],
    "mlp": ["hidden_act", "activation_func", "intermediate_size", "bias_swiglu_fusion"],
    "attn": ["rope_theta", "rope_scaling", "partial_rotary_factor", "rotary interleaving (neox vs gptj)",
             "sliding_window", "attn_logit_softcapping", "softmax scale / head_dim", "attention backend"],
    "o": ["rope_theta", "rope_scaling", "attention backend", "softmax scale"],
    "lm_head": ["lm_head dtype (fp32 lm_head)", "final_logit_softcapping", "tie_word_embeddings", "vocab padding"],
    "logits": ["lm_head dtype (fp32 lm_head)", "final_logit_softcapping", "logits processor scale", "tie_word_embeddings"],
    "embed": ["embedding scale (e.g. sqrt(hidden) in Gemma)", "vocab padding", "tie_word_embeddings"],
    "experts": ["norm_topk_prob (renormalize)", "scoring_func", "num_experts_per_tok", "routed_scaling_factor",
                "hidden_act"],
}


# Roles of modules that hold several weights fused in one (their rows can be packed in either order).
FUSED_ROLES = ("qkv", "gate_up", "qkv_a", "experts", "shared_gate_up")


def config_keys(role: str | None) -> list[str]:
    """Config keys that govern a module role (generic list when the role is unknown)."""
    return CONFIG_KEYS.get(role or "", ["the module's configuration on both sides", "dtype / autocast settings"])


def for_finding(f: dict, vocab: Vocabulary) -> tuple[list[dict], list[str]]:
    """Return (hypotheses, next_checks) for a finding dict built by the triage (``vocab``: output_4's,
    which names the parameter of each point)."""
    hyps, checks = _for_category(f, vocab)
    how = f.get("evidence", {}).get("aligned_by")
    if how in ("values", "order"):
        # No naming rule paired these modules (dumpcompare/value_align.py): the pair itself is a
        # judgement the user can check, and a naming profile makes it certain.
        basis = "the statistics they carry" if how == "values" else "their position between aligned modules"
        checks = checks + [f"{_names(f.get('train_module'))} (train) and {_names(f.get('rollout_module'))} "
                           f"(rollout) were paired by {basis}, not by name: confirm they are the same module, "
                           "or describe the family in a naming profile (--naming)."]
    return hyps, checks


def _parameter(point: str, vocab: Vocabulary) -> str:
    """The parameter a point names (its first part's, from output_4 ``vocabulary.points``); the
    whole name when output_4 does not name one."""
    form = vocab.form(point)
    return (form["parts"][0]["parameter"] if form else None) or point


def _for_category(f: dict, vocab: Vocabulary) -> tuple[list[dict], list[str]]:
    cat, role = f["category"], f.get("role")
    t, r = _names(f.get("train_module")), _names(f.get("rollout_module"))
    keys = ", ".join(config_keys(role))
    if cat == "parameter_or_checkpoint_issue":
        names = sorted({_parameter(p, vocab) for p in f.get("evidence", {}).get("differing_parameters", [])})
        params = "the " + (", ".join(names) if names else "weights")
        hyps = [
            _h(f"The weight sync or checkpoint conversion left a different tensor in {r} (rollout) or {t} (train).",
               "one side's tensor differs from the checkpoint while the other matches it",
               "both sides match the checkpoint bit for bit (then the dump compared different tensors)"),
        ]
        # A row order is a hypothesis only where one side fuses what the other keeps apart.
        if isinstance(f.get("train_module"), list) or isinstance(f.get("rollout_module"), list) \
                or f.get("train_module") != f.get("rollout_module") or f.get("role") in FUSED_ROLES:
            hyps.append(_h("The fused weight is packed in a different order than the other side expects "
                           "(q/k/v or gate/up rows, Megatron per-group layout).",
                           "the two weights hold the same values as a multiset (tensor dump) or the fused output "
                           "statistics match while the split parts at consumers differ",
                           "the multiset of values differs (a real corruption or stale weight)"))
        else:
            hyps.append(_h("The engine loaded this weight under another name or from another shard (a loader's "
                           "name mapping, a tensor-parallel slice taken from the wrong rank).",
                           "the differing tensor equals another checkpoint tensor, or another rank's slice of this one",
                           "it equals no tensor of the checkpoint (a stale or corrupted copy)"))
        if f.get("evidence", {}).get("permuted_fused_rows"):
            hyps.reverse()
        checks = [f"Compare {params} of {t} (train) and {r} (rollout) with the checkpoint tensors they were "
                  f"loaded from (hash per tensor, per layer).",
                  "After a weight update, hash every rollout weight and compare with the trainer's "
                  "(e.g. a check_weight_update_equal step) before generating.",
                  "Rerun the rollout with weights loaded straight from the checkpoint (no sync): if the "
                  "divergence disappears the sync path is at fault."]
        if f.get("evidence", {}).get("parameters_unobserved"):
            # Inferred from the size of the error, not seen: the module's math is the other explanation.
            hyps.append(_h(f"A configuration value used inside {t or r} differs between the engines ({keys}).",
                           "the two configs differ in one of these keys, and recomputing with the other value "
                           "reproduces the other side", "all these keys agree"))
            checks.append("Rerun with --model <checkpoint dir>: the reference forward holds each side to the "
                          "checkpoint and names the side that departs.")
        return hyps, checks
    if cat == "missing_or_extra_op_between_aligned_boundary":
        op = f.get("op_module") or "the one-sided module"
        missing = f.get("missing_on") or "the other side"
        hyps = [
            _h(f"{missing.capitalize()} does not apply the operation {op} performs (e.g. an activation dropped "
               f"by a config or a code path).",
               f"recomputing the boundary from the dumped tensors with the op reproduces the side that has it, "
               f"without it the {missing} side",
               f"the {missing} side applies the same op inline (then the naming profile misses it)"),
            _h(f"Both sides apply an op here but different ones ({op} vs an inline implementation).",
               "the function the other side uses differs (e.g. gelu vs silu, scale constant)",
               "the inline implementation is identical"),
        ]
        checks = [f"Read the {missing} implementation of the module that holds this boundary and confirm "
                  f"whether it applies {op}.", f"Compare config keys on both sides: {keys}.",
                  "Recompute the downstream input from the upstream output in numpy with and without the op "
                  "and see which side it reproduces."]
        return hyps, checks
    if cat == "in_module_impl_difference":
        precision = f.get("evidence", {}).get("precision_boundary")
        hyps = [
            _h(f"A configuration value used inside {t or r} differs between the engines ({keys}).",
               "the two configs differ in one of these keys, and recomputing with the other value reproduces "
               "the other side", "all these keys agree"),
            _h(f"The two engines implement {t or r} differently (kernel, fusion, cast order, precision).",
               "running the same input through both implementations in isolation reproduces the gap",
               "both implementations give the same output on the dumped input"),
        ]
        if f.get("evidence", {}).get("parameters_uncompared"):
            hyps.insert(0, _h(f"The weight of {t or r} differs between the sides; the dumps could not compare it.",
                              "the weight each engine actually uses (read from the engine, e.g. the tied "
                              "embedding or lm_head tensor) differs from the other side's",
                              "both engines' weights equal the checkpoint tensor"))
        boundary = f.get("evidence", {}).get("boundary") or {}
        if boundary.get("role") in ("qkv", "gate_up"):
            fused = _names(boundary.get("rollout_module")) + " / " + _names(boundary.get("train_module"))
            hyps.append(_h(f"The rows of the fused weight just before it ({fused}) are in a different order on one "
                           "side: statistics of a fused output cannot show a permutation, only its consumers can.",
                           "a tensor-mode dump shows the fused weights equal as a multiset but not element-wise",
                           "the fused weights agree element-wise in a tensor-mode dump"))
            checks_extra = ["Dump the same step in tensor mode (msprobe task 'tensor') so the fused weights are "
                            "compared element by element."]
        else:
            checks_extra = []
        if precision:
            hyps.insert(0, _h(f"One side computes {t or r} in lower precision ({precision}).",
                              "the module's output dtype differs across sides and the gap matches that "
                              "dtype's rounding", "forcing both sides to the same dtype leaves the gap"))
        checks = [f"Read these config keys on both sides: {keys}.",
                  f"Feed the dumped input of {t or r} to both implementations offline (tensor dump) and compare.",
                  "Rerun both engines in fp32 / eager mode for this module to isolate kernel and precision effects."]
        return hyps, checks + checks_extra
    if cat == "upstream_propagation" and f.get("evidence", {}).get("before_dumped_range"):
        return _before_range(f, t, r)
    if cat == "upstream_propagation":
        return ([_h("This module only carries a divergence that started upstream.",
                    "fixing the upstream root cause removes it", "it persists after the upstream fix")],
                ["Fix or explain the upstream root cause first, then re-dump."])
    return [], []


def _before_range(f: dict, t: str, r: str) -> tuple[list[dict], list[str]]:
    """A cause before the first dumped module: earlier modules, or the inputs themselves."""
    e = f["evidence"]
    layer = f.get("layer")
    earlier = (f"the embedding and layers 0..{layer - 1}" if isinstance(layer, int) and layer > 0
               else "the embedding and whatever runs before it")
    hyps = [_h(f"A module before {t} (train) / {r} (rollout), outside the dumped range, differs.",
               f"a dump that covers {earlier} shows an aligned pair whose inputs agree and outputs differ",
               "the modules before the entry point all agree in a wider dump")]
    checks = [f"Re-dump with msprobe `scope`/`list` covering {earlier} (both sides, same step), so the "
              f"comparison starts where the inputs still agree."]
    tokens = _h("The two sides were fed different tokens or inputs (prompt, padding, position ids).",
                "the input token ids (or the embedding outputs) differ between the sides",
                "a dump with the embedding shows the token ids equal, by md5 or tensor")
    token_check = ("Compare the token ids both engines received for this step (dump the embedding module, "
                   "md5 or tensor mode) before looking at any module.")
    if not e.get("tokens_verified"):
        hyps.insert(0, tokens)
        checks.insert(0, token_check)
    else:
        hyps.append(tokens)
    return hyps, checks


def _names(x) -> str:
    if x is None:
        return "-"
    return ", ".join(x) if isinstance(x, list) else x


def _h(statement: str, confirm: str, refute: str) -> dict:
    return {"statement": statement, "confirm_if": confirm, "refute_if": refute}
