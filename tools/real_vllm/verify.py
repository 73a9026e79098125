"""Check each fault case against its clean sibling: the module the fault names must be the first
place the faulty dump departs (its inputs equal the clean run's, its output not), at the forward
call the fault starts from; written into case.json ``measured.fault_check``.

The sibling is the clean case with the same family, dtype, TP, prompt, task and trainer; both ran the same
prompt, so their first forward call (and, for a mid-generation sync, every call before the
faulty one) saw the same tokens. Run: python tools/real_vllm/verify.py (standard library only).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "real_vllm"
_SAME = 1e-6


def _key(doc):
    return (doc["family"], doc["dtype"]["rollout"], doc["rollout"]["tp"], doc["prompt_len"],
            json.dumps(doc.get("prompt_ids_head")), doc["mode"], doc.get("layers"), doc["train"]["engine"])


def _entry(side_dir, module, call, rank):
    """The dump entry of ``module`` at forward ``call`` (either layout), or None."""
    steps = sorted(side_dir.glob("step*"), key=lambda p: int(p.name[4:]))
    if len(steps) > 1:
        path, index = steps[call] / f"rank{rank}" / "dump.json", 0
    else:
        path, index = steps[0] / f"rank{rank}" / "dump.json", call
    data = json.loads(path.read_text())["data"]
    for name, entry in data.items():
        head, _, num = name.rpartition(".forward.")
        if head.startswith(f"Module.{module}.") and head.count(".") == module.count(".") + 2 and int(num) == index:
            return entry
    return None


def _tensors(args):
    return [a for a in args or [] if isinstance(a, dict) and "Max" in a]


def _rel(a, b):
    worst = 0.0
    for x, y in zip(a, b):
        for stat in ("Max", "Min", "Norm"):
            if x.get(stat) is None or y.get(stat) is None:
                continue
            worst = max(worst, abs(x[stat] - y[stat]) / max(abs(y[stat]), 1e-12))
    return worst


def check(doc, clean_dir, case_dir):
    """{rank: {input_rel, output_rel}} at the expected module and first faulty call."""
    exp, fault = doc["expected"], doc["fault"]
    side = fault["side"]
    module = exp[f"{side}_modules"][0]
    call = fault.get("call", 0) if side == "rollout" else 0
    out = {}
    for rank in range(doc["rollout"]["tp"] if side == "rollout" else 1):
        got = _entry(case_dir / side, module, call, rank)
        ref = _entry(clean_dir / side, module, call, rank)
        if got is None or ref is None:
            out[f"rank{rank}"] = "module not in the dump"
            continue
        inputs = _tensors(got["input_args"]) + _tensors(list(got.get("input_kwargs", {}).values()))
        ref_inputs = _tensors(ref["input_args"]) + _tensors(list(ref.get("input_kwargs", {}).values()))
        out[f"rank{rank}"] = {"input_rel": _rel(inputs, ref_inputs),
                              "output_rel": _rel(_tensors(got["output"]), _tensors(ref["output"]))}
        if call:  # a fault from call k on: call k-1 must still agree with the clean run
            before = _entry(case_dir / side, module, call - 1, rank), _entry(clean_dir / side, module, call - 1, rank)
            out[f"rank{rank}"]["previous_call_output_rel"] = _rel(_tensors(before[0]["output"]),
                                                                  _tensors(before[1]["output"]))
    return {"module": module, "call": call, "against": clean_dir.name, "ranks": out}


def main():
    docs = {p.parent: json.loads(p.read_text()) for p in DATA.glob("*/case.json")}
    for d, doc in docs.items():  # the prompt itself, so a sibling ran the same ids
        doc["prompt_ids_head"] = json.loads((d / "tokens.json").read_text())["prompt_ids"]
    clean = {_key(doc): d for d, doc in docs.items() if doc["fault"] is None}
    for d, doc in sorted(docs.items()):
        if doc["fault"] is None:
            continue
        sibling = clean.get(_key(doc))
        result = check(doc, sibling, d) if sibling else "no clean sibling"
        doc.pop("prompt_ids_head")
        doc["measured"]["fault_check"] = result
        (d / "case.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(d.name, json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
