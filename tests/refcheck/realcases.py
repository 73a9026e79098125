"""Running the two commands on a case of the real corpus (tests/data/real) with its checkpoint."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "real"
ROOTCAUSE = REPO / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
COMPARE = REPO / "dump-module-mapping-value-compare" / "scripts" / "run_compare.py"


def case(name: str) -> dict:
    return json.loads((CORPUS / name / "case.json").read_text(encoding="utf-8"))


def rank_args(name: str) -> list[str]:
    """Merge the rollout's tensor-parallel ranks; take the train rank holding the rollout's sequence."""
    c = case(name)
    args = ["--rollout-rank", "all"] if c["rollout"]["tp"] > 1 else []
    if c["train"].get("layout", "").startswith("fsdp"):
        args += ["--train-rank", "0"]
    return args


def model_dir(name: str) -> Path:
    """The checkpoint a case was built from: the Megatron cases convert their own tiny Llama
    (``_models/megatron_llama``, tools/real_dumps/cases_megatron.py), the others their family's."""
    c = case(name)
    return CORPUS / "_models" / ("megatron_llama" if c["train"]["engine"] == "megatron-core" else c["family"])


def run(script: Path, name: str, out: Path, *extra: str, model: bool = True) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(script), "--train", str(CORPUS / name / "train"), "--rollout",
            str(CORPUS / name / "rollout"), "--out-dir", str(out), "--quiet", *rank_args(name), *extra]
    if model:
        argv += ["--model", str(model_dir(name))]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def references(out: Path) -> dict:
    """point -> {side: matches_reference record} from output_3: the compared parameters', and a
    parameter one side alone dumps (``reference.<side>.unpaired_parameters``) under that side only."""
    doc = json.loads((out / "output_3_value_compare.json").read_text(encoding="utf-8"))
    refs = {r["point"]: dict(r["reference"]) for r in doc["results"] if r.get("reference")}
    for side, ref in (doc.get("reference") or {}).items():
        for rec in (ref or {}).get("unpaired_parameters") or []:
            refs.setdefault(rec["point"], {})[side] = rec
    return refs


def report(out: Path) -> dict:
    return json.loads((out / "output_5_root_cause_report.json").read_text(encoding="utf-8"))


def run_pair(script: Path, folder: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """Run ``script`` on a case folder outside the corpus (``folder/train``, ``folder/rollout``)."""
    return subprocess.run([sys.executable, str(script), "--train", str(folder / "train"), "--rollout",
                           str(folder / "rollout"), "--out-dir", str(out), "--quiet", *extra],
                          capture_output=True, text=True, timeout=300)


def first_root_cause(folder: Path, out: Path, model: Path) -> tuple[dict, dict]:
    """(the case's injected fault, the first root cause) of the root-cause skill run with ``--model``."""
    fault = json.loads((folder / "case.json").read_text(encoding="utf-8"))["fault"]
    proc = run_pair(ROOTCAUSE, folder, out, "--model", str(model))
    assert proc.returncode == 0, proc.stderr
    return fault, report(out)["root_causes"][0]
