"""Join dumps of one side into one: the steps of one generation, or the stages of a pipeline.

msprobe steps once per vLLM/SGLang ``execute_model``, so a rollout dumped over a prefill and its
decode steps lands in consecutive step folders, each holding call 0 of every module. Renumbered
as calls 0..n of one dump they look exactly like an engine that dumps all calls in one file, and
the prefill/decode stitching (tensor_parallel.md) compares them with the trainer's single forward.

Pipeline stages each hold a range of layers; Megatron numbers a stage's layers from 0, so the
stages are put one after the other with their layer numbers shifted (input_formats.md). Under a
virtual pipeline each rank holds several model chunks, which msprobe names by their index in the
list it was started on (``0.decoder.layers.0``, ``1.decoder.layers.0``); ``split_chunks`` makes
each chunk a stage of its own.

Neither function changes the dumps it is given: joined entries and leaves are new objects.
"""
from __future__ import annotations

import re
from dataclasses import replace

from ..records import BACKWARD, FORWARD, Dump, Entry, Leaf

_LAYER_RE = re.compile(r"(^|\.)layers\.(\d+)(?=\.|$)")
_CHUNK_RE = re.compile(r"^(\d+)\.")


def _own_folder(leaves: list[Leaf], d: Dump, base: Dump) -> list[Leaf]:
    """Leaves whose tensor files stay in their own dump's folder once joined into ``base``."""
    if d is base:
        return leaves
    return [replace(lf, shards=((d.dump_dir, lf.data_name, d.dump_data_dir),))
            if lf.data_name and not lf.shards else lf for lf in leaves]


def _joined(base: Dump, dumps: list[Dump], entries: list[Entry], note: str) -> Dump:
    return replace(base, entries=[replace(e, order=i) for i, e in enumerate(entries)],
                   notes=base.notes + [note] + [n for d in dumps[1:] for n in d.notes],
                   skipped_keys=base.skipped_keys + [k for d in dumps[1:] for k in d.skipped_keys],
                   salvage=base.salvage or next((d.salvage for d in dumps[1:] if d.salvage), None),
                   folded=all(d.folded for d in dumps))


def join_steps(dumps: list[Dump], labels: list) -> Dump:
    """One dump whose calls are the steps' calls, step after step (``dumps`` in step order)."""
    base = dumps[0]
    if len(dumps) == 1:
        return base
    entries, calls = [], {}
    for d in dumps:
        for e in d.entries:
            e = replace(e, leaves=_own_folder(e.leaves, d, base))
            if e.kind == "module" and e.direction in (FORWARD, BACKWARD):
                group = (e.raw_path, e.cls, e.direction)
                call = calls.get(group, 0)
                calls[group] = call + 1
                e = replace(e, call=call, key=f"{e.key.rsplit('.', 1)[0]}.{call}")
            entries.append(e)
    return _joined(base, dumps, entries,
                   f"steps {', '.join(map(str, labels))} joined as calls 0..{len(dumps) - 1} of each module")


def split_chunks(d: Dump) -> list[tuple[int, Dump]]:
    """The model chunks of one rank's dump as ``(chunk index, dump)``, chunk index dropped from
    the names; ``[(0, d)]`` when the dump holds one chunk (or none is named).

    An entry with no chunk index of its own (an API call) goes with the module before it: it ran
    inside that chunk's forward."""
    chunks = {m.group(1) for e in d.entries if e.kind == "module" for m in [_CHUNK_RE.match(e.raw_path)] if m}
    if len(chunks) < 2:
        return [(0, d)]
    parts: dict[int, list[Entry]] = {}
    current = None
    for e in d.entries:
        m = _CHUNK_RE.match(e.raw_path) if e.kind == "module" else None
        if m:
            current = int(m.group(1))
            prefix = m.group(0)
            path = e.raw_path[len(prefix):]
            e = replace(e, raw_path=path, key=e.key.replace(f".{prefix}", ".", 1))
        parts.setdefault(current if current is not None else min(map(int, chunks)), []).append(e)
    # Model chunks each run decoder layers; numbered children that do not (the items of an
    # nn.Sequential given to msprobe) are one model, not chunks.
    if any(not any(_LAYER_RE.search(e.raw_path) for e in es) for es in parts.values()):
        return [(0, d)]
    return [(c, replace(d, entries=[replace(e, order=i) for i, e in enumerate(es)])) for c, es in sorted(parts.items())]


def layer_numbers(d: Dump) -> set[int]:
    """The layer indices the module paths of a dump name."""
    out = set()
    for e in d.entries:
        m = _LAYER_RE.search(e.raw_path)
        if m:
            out.add(int(m.group(2)))
    return out


def join_stages(stages: list[Dump], offsets: list[int], labels: list) -> Dump:
    """Pipeline stages (in pipeline order) as one model; ``offsets`` shift each stage's layer numbers."""
    base = stages[0]
    if len(stages) == 1:
        return base
    entries = []
    for d, off in zip(stages, offsets):
        for e in d.entries:
            e = replace(e, leaves=_own_folder(e.leaves, d, base))
            if off:
                def shift(m, off=off):
                    return f"{m.group(1)}layers.{int(m.group(2)) + off}"
                path = _LAYER_RE.sub(shift, e.raw_path, count=1)
                if path != e.raw_path:
                    e = replace(e, raw_path=path, key=e.key.replace(e.raw_path, path, 1))
            entries.append(e)
    # Modules outside the layers that every stage runs (the decoder container, rotary tables, the
    # model root) hold that stage's part only: the last stage's copy is the model's (its decoder
    # output is the final stream), so earlier copies are dropped.
    last = {e.key: i for i, e in enumerate(entries)}
    dropped = sum(1 for i, e in enumerate(entries) if last[e.key] != i)
    entries = [e for i, e in enumerate(entries) if last[e.key] == i]
    shifted = [f"{lab}+{off}" for lab, off in zip(labels, offsets) if off]
    return _joined(base, stages, entries,
                   f"pipeline stages (ranks {', '.join(map(str, labels))}) joined in order"
                   + (f"; stage layer numbers shifted ({', '.join(shifted)})" if shifted else "")
                   + (f"; {dropped} modules every stage runs kept from the last stage" if dropped else ""))
