"""Qwen3-MoE in tensor mode: routing replay and stacked experts against the checkpoint.

transformers 5.x Qwen3-MoE (router module returning logits, top-k weights and ids; stacked
``experts``) against the vLLM-shaped rollout (``mlp.gate`` GateLinear logits, computed inside the
``MoERunner`` at ``mlp.experts``, which chooses the top-k itself), both dumped as tensors so that routing can be replayed from each side's logits.
tools/make_real_dumps.py finds this module (``--list`` shows the cases, ``--only NAME`` makes one).

Public API:
    MoeCase                 cases.Case with a ``summary`` line for ``--list``
    CASES                   name -> MoeCase, in generation order
    make_case(case, root) -> dict   as make_real_dumps.make_case (same sides, same case.json)

Faults: ``routing`` flips ``norm_topk_prob`` on one side (vLLM's MoE ``renormalize``, the
transformers router's ``norm_topk_prob``), a ``stale_weight`` on a stacked experts tensor.
case.json is derived from the fault and the measurement as in cases.py.
"""
from __future__ import annotations

from .cases import Case, fault

_BF16 = {"train": "bf16", "rollout": "bf16"}
_FUSED = {"rms_kernel": "fused"}
# bf16 keeps a tensor-mode case under 1.5 MB (fp32 parameters alone make it 1.8 MB)
_SMALL = {"family": "qwen3_moe", "task": "tensor", "dtype": _BF16, "rollout_opts": _FUSED}


class MoeCase(Case):
    def summary(self) -> str:
        """One line for ``make_real_dumps.py --list``."""
        return (f"{self.family:9} {self.mode:10} {self.train_layout:5} {self.rollout_engine:6} "
                f"tp={self.rollout_tp} steps={self.new_tokens} {self.dtype['rollout']}")


def _routing(side, value):
    engine = "FusedMoE renormalize" if side == "rollout" else "router norm_topk_prob"
    return fault(side, "routing", "model.layers.0.mlp.experts",
                 f"{side} {engine}={value} while the config's norm_topk_prob is True", value=value)


CASES = {c.name: c for c in [
    # bf16 router logits differ by rounding (about 0.02 here). With this prompt no token's 2nd and
    # 3rd experts are that close (the nearest are 0.035 apart): no flip.
    MoeCase("qwen3_moe_tensor_bf16_clean", **_SMALL, prompt_len=16),
    # One prompt in about ten of 16 tokens has a token whose 2nd and 3rd experts tie within that
    # rounding; this one (seed 317) flips one token of layer 0 between the engines.
    MoeCase("qwen3_moe_tensor_bf16_flip_clean", **_SMALL, prompt_len=16, prompt_seed=317),
    MoeCase("qwen3_moe_tensor_norm_topk_rollout", **_SMALL, fault=_routing("rollout", False)),
    MoeCase("qwen3_moe_tensor_norm_topk_train", **_SMALL, fault=_routing("train", False)),
    MoeCase("qwen3_moe_tensor_stale_expert_train", **_SMALL, fault=fault(
        "train", "stale_weight", "model.layers.0.mlp.experts",
        "train side restored layer 0 experts' gate_up_proj from an older checkpoint",
        param="model.layers.0.mlp.experts.gate_up_proj")),
]}


def make_case(case, root):
    """Write ``root/<case.name>/`` with the corpus's own sides; returns the case.json document."""
    import make_real_dumps  # the driver that imported this module: its make_case writes every HF case

    return make_real_dumps.make_case(case, root)
