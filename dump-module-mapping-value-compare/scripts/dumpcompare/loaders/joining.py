"""Join the step folders of one generation (a prefill step, then one step per decode) into one dump.

msprobe steps once per vLLM/SGLang ``execute_model``, so a rollout dumped over a prefill and its
decode steps lands in consecutive step folders, each holding call 0 of every module. Renumbered
as calls 0..n of one dump they look exactly like an engine that dumps all calls in one file, and
the prefill/decode stitching (tensor_parallel.md) compares them with the trainer's single forward.
"""
from __future__ import annotations

from ..records import BACKWARD, FORWARD, Dump


def join_steps(dumps: list[Dump], labels: list[str]) -> Dump:
    """One dump whose calls are the steps' calls, step after step (``dumps`` in step order)."""
    base = dumps[0]
    if len(dumps) == 1:
        return base
    entries, calls = [], {}
    for d in dumps:
        for e in d.entries:
            if d is not base:
                # Tensor files stay in their own step's folder.
                for lf in e.leaves:
                    if lf.data_name and not lf.shards:
                        lf.shards = ((d.dump_dir, lf.data_name, d.dump_data_dir),)
            if e.kind == "module" and e.direction in (FORWARD, BACKWARD):
                group = (e.raw_path, e.cls, e.direction)
                e.call = calls.get(group, 0)
                calls[group] = e.call + 1
                e.key = f"{e.key.rsplit('.', 1)[0]}.{e.call}"
            entries.append(e)
    for i, e in enumerate(entries):
        e.order = i
    base.entries = entries
    base.notes += [f"steps {', '.join(labels)} joined as calls 0..{len(dumps) - 1} of each module"]
    base.notes += [n for d in dumps[1:] for n in d.notes]
    base.skipped_keys += [k for d in dumps[1:] for k in d.skipped_keys]
    base.salvage = base.salvage or next((d.salvage for d in dumps[1:] if d.salvage), None)
    return base
