"""Root cause on SGLang-dumper output: the same finding as on msprobe dumps of the same run.

tests/data/real_sglang holds one run of a tiny HF Llama (train) and its vLLM-structured rollout on
2 tensor-parallel ranks whose layer-1 down_proj weight is stale, dumped by the SGLang dumper and by
msprobe (README.md there).
"""
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "real_sglang"
PAIRS = {
    "msprobe": (DATA / "msprobe" / "train", DATA / "msprobe" / "rollout"),
    "dumper": (DATA / "dumper" / "train", DATA / "dumper" / "rollout"),
    "mixed": (DATA / "msprobe" / "train", DATA / "dumper" / "rollout"),
}


def _finding(doc):
    rc = doc["root_causes"][0]
    return rc["category"], rc["side"], rc["train_module"], rc["rollout_module"], rc["layer"]


@pytest.mark.parametrize("pair", ["dumper", "mixed"])
def test_dumper_dumps_give_the_msprobe_finding(analyze_pair, pair):
    reference = analyze_pair(*PAIRS["msprobe"], "--rollout-rank", "all").doc
    doc = analyze_pair(*PAIRS[pair], "--rollout-rank", "all").doc
    assert reference["verdict"] == doc["verdict"] == "root_cause_found"
    assert _finding(reference) == ("parameter_or_checkpoint_issue", "undetermined",
                                   "model.layers.1.mlp.down_proj", "model.layers.1.mlp.down_proj", 1)
    assert _finding(doc) == _finding(reference)
    assert doc["root_causes"][0]["evidence"]["differing_parameters"] == ["L1.down.weight"]
    assert doc["comparability"]["comparable"] is True
    assert doc["mode"] == ("tensor" if pair == "dumper" else "statistics")
