"""Write real tensor-mode msprobe dumps with a config fault on either side into tests/data/replay/
(a developer tool; the replay tests read what it wrote).

The cases use the real-corpus machinery (tools/real_dumps: transformers train side, vLLM-structured
rollout, msprobe) and the corpus's tiny Llama checkpoint (tests/data/real/_models/llama). The
corpus itself has config faults in statistics mode and on the rollout only; replaying a module
needs its tensors, and "each side" needs the fault on the trainer too, which this tool adds by
changing the built transformers model (every RMSNorm's eps, or every act_fn); the attention
faults are in tools/real_dumps/attention_faults.py. Needs torch,
transformers, mindstudio-probe (e.g. /work/toolenv/bin/python).

    python tools/make_replay_cases.py            # every case
    python tools/make_replay_cases.py NAME...    # only these cases
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_real_dumps  # noqa: E402
from real_dumps import attention_faults, sides  # noqa: E402
from real_dumps.cases import Case, fault  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "replay"
_EPS = "every RMSNorm built with eps 1e-2 instead of the config's 1e-6"
_ACT = "act_fn computes gelu(tanh) instead of silu"

CASES = [
    Case("llama_tensor_norm_eps_rollout", task="tensor", fault=fault(
        "rollout", "norm_eps", "model.layers.0.input_layernorm", "rollout: " + _EPS, value=1e-2)),
    Case("llama_tensor_norm_eps_train", task="tensor", fault=fault(
        "train", "norm_eps", "model.layers.0.input_layernorm", "train: " + _EPS, value=1e-2)),
    Case("llama_tensor_act_swap_rollout", task="tensor", fault=fault(
        "rollout", "act_swap", "model.layers.0.mlp.act_fn", "rollout: " + _ACT, value="gelu")),
    Case("llama_tensor_act_swap_train", task="tensor", fault=fault(
        "train", "act_swap", "model.layers.0.mlp.act_fn", "train: " + _ACT, value="gelu")),
] + attention_faults.CASES

_ORIGINAL_TRAIN_MODEL = sides._train_model
_ORIGINAL_ROLLOUT_MODEL = sides._rollout_model
_ATTENTION = ("attn_scale", "rope_theta")


def _train_model(case, fault_):
    """The transformers model, with a config fault applied to the trainer when the case has one."""
    import torch.nn as nn
    import transformers.activations as acts

    if fault_ and fault_["kind"] in _ATTENTION:
        return attention_faults.train_model(_ORIGINAL_TRAIN_MODEL(case, None), fault_)
    if not fault_ or fault_["kind"] not in ("norm_eps", "act_swap"):
        return _ORIGINAL_TRAIN_MODEL(case, fault_)
    model = _ORIGINAL_TRAIN_MODEL(case, None)
    for name, mod in model.named_modules():
        if fault_["kind"] == "norm_eps" and hasattr(mod, "variance_epsilon"):
            mod.variance_epsilon = fault_["value"]
        if fault_["kind"] == "act_swap" and name.endswith("mlp"):
            mod.act_fn = acts.ACT2FN["gelu_pytorch_tanh"]
            assert isinstance(mod.act_fn, nn.Module)
    return model


def _rollout_model(case, fault_, state):
    """The vLLM-structured model, with an attention fault applied when the case has one."""
    if fault_ and fault_["kind"] in _ATTENTION:
        return attention_faults.rollout_model(_ORIGINAL_ROLLOUT_MODEL(case, None, state), fault_)
    return _ORIGINAL_ROLLOUT_MODEL(case, fault_, state)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("cases", nargs="*", metavar="CASE", help="make only these cases (default: every case)")
    only = set(ap.parse_args(argv).cases)
    unknown = only - {c.name for c in CASES}
    if unknown:
        print(f"error: unknown case(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    sides._train_model = _train_model
    sides._rollout_model = _rollout_model
    import msprobe.pytorch  # noqa: F401  imported before forking, as make_real_dumps does
    OUT.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        if only and case.name not in only:
            continue
        doc = make_real_dumps.make_case(case, OUT)
        for stack in (OUT / case.name).rglob("stack.json"):   # call stacks: nothing reads them
            stack.unlink()
        print(f"{case.name}: {doc['measured']}", file=sys.stderr)
    # make_case saved the family checkpoint beside the cases: the same seeded weights as the
    # corpus's copy, which the tests use
    import shutil
    shutil.rmtree(OUT / "_models", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
