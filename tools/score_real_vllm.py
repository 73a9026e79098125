"""Score the root-cause command on the real-vLLM corpus (tests/data/real_vllm/): per case and way
of passing the ids, expected vs got (verdict, category, module, side), then the totals.

    .venv/bin/python tools/score_real_vllm.py [--variant ids_list|tokens_file|no_ids] [--jobs 2]
        [--write-known-wrong]

``--write-known-wrong`` rewrites tests/real_vllm/known_wrong.json with every run that is wrong
today (the strict xfail list of tests/real_vllm/test_real_vllm_corpus.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from real_vllm import vllm_corpus as vc  # noqa: E402


def _expected(exp):
    module = (exp["rollout_modules"] or [None])[0]
    return {"verdict": exp["verdict"], "category": exp["category"], "module": module, "side": exp["side"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", help="only these variants (default: all that apply)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--write-known-wrong", action="store_true")
    args = ap.parse_args(argv)
    runs = [(n, v) for n in vc.case_names() for v in vc.variants(n) if not args.variant or v in args.variant]
    with tempfile.TemporaryDirectory() as tmp:
        def one(run):
            return run, vc.judge(*run, Path(tmp) / f"{run[0]}__{run[1]}")
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(one, runs))
    wrong = {}
    by_variant = {}
    for (name, variant), (problems, said) in results:
        ok = not problems
        tally = by_variant.setdefault(variant, [0, 0])
        tally[0] += ok
        tally[1] += 1
        exp = _expected(vc.case_doc(name)["expected"])
        print(f"{'ok   ' if ok else 'WRONG'} {name} [{variant}]\n      expected {exp}\n      got      {said}"
              + ("" if ok else f"\n      wrong:   {'; '.join(problems)}"))
        if not ok:
            wrong[f"{name}/{variant}"] = "; ".join(problems)
    total = sum(t[0] for t in by_variant.values()), sum(t[1] for t in by_variant.values())
    print("\nscore: " + ", ".join(f"{v} {a}/{b}" for v, (a, b) in sorted(by_variant.items()))
          + f"; total {total[0]}/{total[1]} right")
    if args.write_known_wrong:
        vc.KNOWN_WRONG.write_text(json.dumps(dict(sorted(wrong.items())), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {vc.KNOWN_WRONG} ({len(wrong)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
