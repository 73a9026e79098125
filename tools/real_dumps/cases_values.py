"""A family no naming profile describes: transformers' GPT-NeoX (train) against an engine-style
re-creation of it with other module names (rollout, renamed_like.py), for mapping by values.

Both sides run the same seeded checkpoint on the same 8-token prompt, one msprobe step each (the
rollout is prefill only, so both hold the same tokens). A fault changes one side's weights only.
tools/make_real_dumps.py finds this module (``--list`` shows the cases, ``--only NAME`` makes one).

Public API:
    ValuesCase              dataclass: name, dtype ("fp32" | "bf16", both sides), fault
    CASES                   name -> ValuesCase, in generation order
    make_case(case, root) -> dict   writes root/<name>/{train,rollout}/ and case.json, returns the doc

case.json follows the corpus schema (cases.describe); ``expected`` is derived from the fault (a stale
weight: parameter_or_checkpoint_issue, the side not shown by the dumps) and checked against the
activations (``cases.check_signal``). ``measured.noise`` compares the modules ``hf_names`` maps.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .cases import CLEAN_EXPECTED, check_signal, fault

FAMILY = "gpt_neox"
PROMPT_LEN = 8
CONFIG = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=64, rotary_pct=0.5, hidden_act="gelu",
              attn_implementation="eager")


@dataclass(frozen=True)
class ValuesCase:
    name: str
    dtype: str = "fp32"
    fault: dict | None = None
    mode: str = "statistics"

    def summary(self) -> str:
        """One line for ``make_real_dumps.py --list``."""
        return f"{FAMILY} hf vs renamed_like {self.mode} {self.dtype}"


CASES = {c.name: c for c in [
    ValuesCase("neox_renamed_fp32_clean"),
    ValuesCase("neox_renamed_bf16_clean", dtype="bf16"),
    ValuesCase("neox_renamed_fp32_stale_fc_out", fault=fault(
        "rollout", "stale_weight", "backbone.blocks.1.ffn.fc_out",
        "rollout kept layer 1 fc_out.weight (transformers: mlp.dense_4h_to_h) of the previous step",
        param="gpt_neox.layers.1.mlp.dense_4h_to_h.weight", layer=1,
        train_modules=["gpt_neox.layers.1.mlp.dense_4h_to_h"],
        rollout_modules=["backbone.blocks.1.ffn.fc_out"])),
    ValuesCase("neox_renamed_fp32_stale_dense_train", fault=fault(
        "train", "stale_weight", "gpt_neox.layers.0.attention.dense",
        "train side restored layer 0 attention.dense.weight from an older checkpoint",
        param="gpt_neox.layers.0.attention.dense.weight", layer=0,
        train_modules=["gpt_neox.layers.0.attention.dense"],
        rollout_modules=["backbone.blocks.0.mixer.proj"])),
]}


def _dtype(case):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16}[case.dtype]


def hf_model():
    """The seeded transformers GPT-NeoX both sides load (fp32), as families.hf_model seeds weights."""
    import torch
    import transformers

    torch.manual_seed(2000)
    model = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**CONFIG)).eval()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # LayerNorm weights and biases away from 1 and 0, so a wrong one shows
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            else:  # 0.1 keeps activations O(1) through 2 layers
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def _state(case, side):
    from .sides import stale

    state = hf_model().state_dict()
    f = case.fault
    return stale(state, f["param"]) if f and f["side"] == side else state


def _prompt():
    import torch

    return torch.randint(3, CONFIG["vocab_size"], (PROMPT_LEN,), generator=torch.Generator().manual_seed(42))


def _rollout(case, out, scratch):
    import torch

    from . import msprobe_run, renamed_like
    from .sides import Capture

    runs = {}
    for run, state in (("dumped", _state(case, "rollout")), ("clean", hf_model().state_dict())):
        model = renamed_like.build(hf_model().config, _dtype(case))
        model.load_weights(state)
        cap = Capture(model)
        ids = _prompt()
        with torch.no_grad():
            if run == "dumped":
                probe = msprobe_run.Probe(out, case.mode)
                with probe.step_scope(model)(0):
                    model.compute_logits(model(ids, torch.arange(PROMPT_LEN))[-1:])
            else:
                model.compute_logits(model(ids, torch.arange(PROMPT_LEN))[-1:])
        runs[run] = cap.stop()
    torch.save(runs, Path(scratch) / "rollout.pt")


def _train(case, out, scratch):
    import torch

    from . import msprobe_run
    from .sides import Capture

    runs = {}
    for run, state in (("dumped", _state(case, "train")), ("clean", hf_model().state_dict())):
        model = hf_model()
        model.load_state_dict(state)
        model = model.to(_dtype(case))
        cap = Capture(model)
        ids = _prompt()[None]
        if run == "dumped":
            msprobe_run.Probe(out, case.mode).forward(model, lambda: model(input_ids=ids))
        else:
            with torch.no_grad():
                model(input_ids=ids)
        runs[run] = cap.stop()
    torch.save(runs, Path(scratch) / "train.pt")


def _rel(a, b):
    import torch

    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    return float(torch.linalg.norm(a - b) / max(float(torch.linalg.norm(b)), 1e-30))


def measure(case, scratch):
    """Largest clean train-vs-rollout difference over the modules renamed_like.hf_names maps, and
    the fault's signal at its module (faulty against clean run of the same side)."""
    import torch

    from .renamed_like import hf_names

    train = torch.load(Path(scratch) / "train.pt")
    rollout = torch.load(Path(scratch) / "rollout.pt")
    noise, where = 0.0, None
    for ours, theirs in hf_names(CONFIG["num_hidden_layers"]).items():
        t, r = train["clean"].get(theirs), rollout["clean"].get(ours)
        if t is None or r is None or t.numel() != r.numel():
            continue  # the logits: the rollout computes the last row only
        e = _rel(r, t)
        if e >= noise:
            noise, where = e, theirs
    out = {"noise": noise, "noise_module": where}
    f = case.fault
    if f is None:
        return out
    caps = train if f["side"] == "train" else rollout
    signal = _rel(caps["dumped"][f["target"]], caps["clean"][f["target"]])
    return {**out, "module": f["target"], "rank": None, "rel_error": signal,
            "ratio": signal / noise if noise else float("inf")}


def describe(case, measured):
    """The case.json document (corpus schema 1)."""
    f = case.fault
    expected = dict(CLEAN_EXPECTED)
    if f is not None:
        check_signal(case.name, f, measured)
        expected = {"verdict": "root_cause_found", "category": "parameter_or_checkpoint_issue", "side": None,
                    "train_modules": f["train_modules"], "rollout_modules": f["rollout_modules"],
                    "layer": f["layer"]}
    return {
        "schema": 1, "case": case.name, "family": FAMILY, "mode": case.mode,
        "dtype": {"train": case.dtype, "rollout": case.dtype},
        "train": {"engine": "transformers", "tp": 1, "layout": "hf",
                  "notes": "GPTNeoXForCausalLM, one forward of the 8-token prompt"},
        "rollout": {"engine": "renamed_like", "tp": 1, "steps": 1,
                    "notes": "prefill only (step0); tools/real_dumps/renamed_like.py: the same computation "
                             "under a module tree no naming profile describes"},
        "fault": None if f is None else {k: f[k] for k in ("side", "kind", "target", "rank", "detail")},
        "expected": expected,
        "measured": measured,
    }


def _round(x):
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def make_case(case, root):
    """Write ``root/<case.name>/`` (train/, rollout/, case.json); returns the case.json document."""
    from . import msprobe_run

    dest = Path(root) / case.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as scratch:
        msprobe_run.run_ranks(_rollout, 1, case, str(dest / "rollout"), scratch)
        msprobe_run.run_ranks(_train, 0, case, str(dest / "train"), scratch)
        msprobe_run.stable_proc_names(dest / "train")
        doc = _round(describe(case, measure(case, scratch)))
    (dest / "case.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc
