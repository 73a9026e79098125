"""The two sides of a case, each run in its own process(es) under msprobe.

Public API (each function is a ``msprobe_run.run_ranks`` target):
    rollout_side(case, out, scratch)   vllm_like (or sglang_like) rollout of the case's family: generate
        ``case.new_tokens`` tokens from the prompt (one msprobe step per engine forward), write the
        sampled tokens to ``scratch/tokens.json`` (rank 0) and the prefill outputs of every module
        to ``scratch/rollout_rank<r>.pt`` (faulty run and, under a fault, a clean shadow run)
    train_side(case, out, scratch)     transformers forward of prompt + sampled tokens (minus the
        last, which no engine forward consumed) as one msprobe step; outputs to
        ``scratch/train.pt``.  With ``case.train_layout`` fsdp1/fsdp2 it runs on 2 ranks (FSDP over
        gloo); rank 0 trains on the rollout's sequence, rank 1 on another one (data parallel)
    stale(state, name, seed, expert) -> state  a copy of an HF state dict whose ``name`` (or its stacked
                                       expert ``expert`` alone) holds the weight of
        an older step (the current one minus a seeded update of half its std)

Faults: stale_weight on either side; on the rollout also wrong_shard, norm_eps, act_swap, extra_op,
dtype; routing (``norm_topk_prob`` set to the fault's value: FusedMoE ``renormalize`` on the rollout,
every router's ``norm_topk_prob`` on the train side).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from . import dist, families, msprobe_run, sglang_like, vllm_like

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Capture:
    """Forward hooks keeping each module's first output tensor of the first call (the prefill)."""

    def __init__(self, model):
        self.out = {}
        # FSDP1 wrapper names dropped: the measurement compares module paths across engines
        self.handles = [m.register_forward_hook(self._hook(n.replace("_fsdp_wrapped_module.", "")))
                        for n, m in model.named_modules() if n]

    def _hook(self, name):
        def hook(_mod, _inp, out):
            if isinstance(out, (tuple, list)):
                out = out[0] if out else None
            if isinstance(out, torch.Tensor) and name not in self.out:
                self.out[name] = out.detach().float().clone()
        return hook

    def stop(self):
        for h in self.handles:
            h.remove()
        return self.out


def stale(state, name, seed=5, expert=None):
    """``state`` with ``name`` moved by a seeded update (only stacked expert ``expert`` when given)."""
    w = state[name]
    gen = torch.Generator().manual_seed(seed)
    update = 0.5 * w.float().std() * torch.randn(w.shape, generator=gen)
    if expert is not None:
        keep = torch.ones(w.shape[0], dtype=torch.bool)
        keep[expert] = False
        update[keep] = 0
    return {**state, name: (w.float() - update).to(w.dtype)}


def _fault_on(case, side):
    return case.fault if case.fault and case.fault["side"] == side else None


def _rollout_model(case, fault, state):
    cfg = families.hf_config(case.family)
    opts = dict(case.rollout_opts)
    kind = fault["kind"] if fault else None
    if kind == "norm_eps":
        opts["norm_eps"] = fault["value"]
    elif kind == "act_swap":
        opts["act_override"] = fault["value"]
    elif kind == "extra_op":
        opts["extra_act_layer"] = fault["layer"]
    elif kind == "dtype":
        opts["lm_head_dtype"] = DTYPES[fault["value"]]
    elif kind == "routing":
        opts["renormalize"] = fault["value"]
    model = _engine(case).build(cfg, DTYPES[case.dtype["rollout"]], case.family, **opts)
    if kind == "wrong_shard":
        module = model.get_submodule(fault["target"])
        module.wrong_shard = (fault["shard_id"], fault["from_rank"], fault["rank"])
    if kind == "stale_weight":
        state = stale(state, fault["param"], expert=fault.get("expert"))
    model.load_weights(state)
    return model


def _engine(case):
    return sglang_like if case.rollout_engine == "sglang" else vllm_like


def rollout_side(case, out, scratch):
    torch.manual_seed(0)
    state = families.hf_model(case.family).state_dict()  # the fp32 master weights
    fault = _fault_on(case, "rollout")
    model = _rollout_model(case, fault, state)
    probe = msprobe_run.Probe(out, case.task, case.summary_mode)
    ids = families.prompt(case.family, case.prompt_len, case.prompt_seed)
    cap = Capture(model)
    tokens = _engine(case).generate(model, ids, case.new_tokens, probe.step_scope(model))
    caps = {"faulty" if fault else "clean": cap.stop()}
    if fault:
        clean = _rollout_model(case, None, state)
        cap = Capture(clean)
        _engine(case).generate(clean, ids, 1)  # the prefill is all the measurement uses
        caps["clean"] = cap.stop()
    torch.save(caps, Path(scratch) / f"rollout_rank{dist.rank()}.pt")
    if dist.rank() == 0:
        (Path(scratch) / "tokens.json").write_text(json.dumps(tokens))


def _train_model(case, fault):
    model = families.hf_model(case.family)
    if fault and fault["kind"] == "stale_weight":
        model.load_state_dict(stale(model.state_dict(), fault["param"]))
    elif fault and fault["kind"] == "routing":  # the router renormalises as the fault's value says
        for layer in model.model.layers:
            layer.mlp.gate.norm_topk_prob = fault["value"]
    elif fault:
        raise ValueError(f"{case.name}: train-side fault {fault['kind']} is not implemented")
    return model.to(DTYPES[case.dtype["train"]])


def _wrap(case, model):
    """FSDP over this process group: fsdp1 wraps each decoder layer and the model (wrapper names in
    every path), fsdp2 shards them with fully_shard (paths unchanged)."""
    if case.train_layout == "hf":
        return model
    layer_cls = type(model.model.layers[0])
    if case.train_layout == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True,
                                        auto_wrap_policy=ModuleWrapPolicy({layer_cls}))
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    return fully_shard(model)


def train_side(case, out, scratch):
    torch.manual_seed(0)
    tokens = json.loads((Path(scratch) / "tokens.json").read_text())
    seq = families.prompt(case.family, case.prompt_len, case.prompt_seed) + tokens[:-1]
    if dist.rank() > 0:  # data parallel: the other ranks train on other sequences of the batch
        seq = families.prompt(case.family, len(seq), seed=42 + dist.rank())
    ids = torch.tensor([seq])
    fault = _fault_on(case, "train")
    model = _wrap(case, _train_model(case, fault))
    probe = msprobe_run.Probe(out, case.task, case.summary_mode)
    cap = Capture(model)
    probe.forward(model, lambda: model(input_ids=ids))
    caps = {"faulty" if fault else "clean": cap.stop()}
    if fault:
        clean = _wrap(case, _train_model(case, None))
        cap = Capture(clean)
        with torch.no_grad():
            clean(input_ids=ids)
        caps["clean"] = cap.stop()
    if dist.rank() == 0:
        torch.save(caps, Path(scratch) / "train.pt")
