"""dump_vllm.py with a weight sync that lands in the middle of the generation.

An RL job's weight sync runs between ``generate`` calls; one that lands while a generation is in
flight (asynchronous rollouts, a partial sync) changes the weights from some forward call on.
``generate()`` blocks, so the sync is made inside the worker: ``execute_model`` is wrapped to call
vLLM's own ``reload_weights`` (the RL weight-sync entry point) with the faulty checkpoint's tensors
just before forward call ``--sync-call`` (0 = the prefill).

Run: /work/venv-vllm/bin/python tools/real_vllm/sync_rollout.py --sync-call K --sync-from DIR
     <dump_vllm.py options>
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "rl-consistency-analysis" / "scripts"))
sys.path.insert(0, str(ROOT / "tools" / "real_vllm"))


def arm_sync(worker, call, weights):
    """Reload ``weights`` (checkpoint names) in this worker just before forward call ``call``."""
    runner = worker.model_runner
    inner = runner.execute_model
    seen = [0]

    def wrapped(scheduler_output, *args, **kwargs):
        if getattr(scheduler_output, "total_num_scheduled_tokens", 1) > 0:
            if seen[0] == call:
                runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
            seen[0] += 1
        return inner(scheduler_output, *args, **kwargs)

    runner.execute_model = wrapped


def main(argv=None):
    import argparse

    import dump_vllm
    import faults

    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--sync-call", type=int, required=True)
    pre.add_argument("--sync-from", required=True)
    mine, rest = pre.parse_known_args(argv)
    args = dump_vllm.build_parser().parse_args(rest)
    prompts = dump_vllm.check(args)
    llm = dump_vllm.make_engine(args, len(prompts[0]))
    llm.collective_rpc(arm_sync, args=(mine.sync_call, faults.read_weights(mine.sync_from)))
    response, _ = dump_vllm.dump(llm, args, prompts[0])
    print(f"wrote {args.out}: {len(response)} forward calls, weights of {mine.sync_from} from call {mine.sync_call}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
