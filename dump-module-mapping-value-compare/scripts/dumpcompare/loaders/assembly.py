"""Execute the input plan: read each side rank by rank and build its one logical dump.

The files are read rank after rank (all steps of rank 0, then rank 1, ...). Each rank's steps are
joined into one dump, which is merged at once into the running merge of the ranks holding the
same modules (``unshard.RankMerge``) and then dropped. So a side holds its merge so far and the
incoming rank, not every rank: memory follows the largest rank file, not their number.

How the ranks relate (tensor-parallel shards, pipeline stages) is decided from their content
(``unshard.rank_relation``) once all are seen; ranks with the same modules are exactly the ones
merged together, so the running merges are that decision's stages.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable

from ..errors import InputError
from ..naming import ModuleRecord, Namer, name_side
from ..records import Dump
from ..unshard import RankLayout, RankMerge, rank_relation
from . import load_input
from .inputs import SIDES, InputPlan, SidePlan
from .joining import join_stages, join_steps, layer_numbers, split_chunks
from .parallel import load_files


@dataclass
class Side:
    """One side as the comparison sees it."""
    dump: Dump
    family: str
    recs: list[ModuleRecord]
    layout: RankLayout


def assemble_sides(plan: InputPlan, namer: Namer, families: dict, *, fold: bool = True, fmt: str = "auto",
                   jobs: int | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Side]:
    """Read every file the plan names (``jobs`` processes) and build both sides.

    ``families`` holds each side's --<side>-family (None: detected); ``fmt`` "msprobe" or
    "generic" refuses a file of another format.
    """
    # Rank-outer order: every step of rank 0, then of rank 1, ... (train, then rollout).
    paths = [st.files[r].path for s in SIDES for r in range(plan.side(s).n_ranks) for st in plan.side(s).steps]
    if jobs is None and any(plan.side(s).n_ranks > 1 for s in SIDES):
        # Each loader process holds a file's parse and its own interpreter: with several rank
        # files merged one by one, one reader keeps memory near the largest rank file (README,
        # "Scale"); --jobs N trades that memory for reading N files at once.
        jobs = 1
    stream = load_files(paths, functools.partial(load_input, fold=fold), jobs, progress)
    out = {}
    made: dict[str, str] = {}       # point names both sides' records share (naming.name_side)
    for s in SIDES:
        out[s] = _assemble(plan.side(s), _ranks(plan.side(s), stream, fmt), namer, families.get(s), made)
    return out


def _ranks(side: SidePlan, stream, fmt: str):
    """The side's ranks in rank order, each its steps joined (the stream is read as they are taken)."""
    for _r in range(side.n_ranks):
        steps = [_checked(next(stream), fmt) for _k in side.steps]
        yield join_steps(steps, [st.step for st in side.steps])
        # Released before the next rank is read, so that at most one rank is held here.
        del steps


def _checked(dump: Dump, fmt: str) -> Dump:
    if fmt in ("msprobe", "generic") and dump.fmt != fmt:
        raise InputError(f"{dump.path}: not a {fmt} dump (--format {fmt})")
    return dump


def _assemble(side: SidePlan, ranks, namer: Namer, family: str | None, made: dict[str, str]) -> Side:
    """One logical dump of a side: steps joined per rank, then the ranks merged as their content
    says (tensor-parallel shards, pipeline stages)."""
    # The token count tells a sequence-parallel slice from a feature shard (unshard.RuleFacts.rule).
    tokens = next((f.tokens.numel for st in side.steps for f in st.files if f.tokens is not None), None)
    rules = {**(namer.p.get("tensor_parallel", {}) or {}), "tokens": tokens if len(side.steps) == 1 else None}
    # A unit is one model chunk of one rank: under a virtual pipeline every rank holds several
    # (joining.split_chunks), each a stage of its own, run chunk-major (chunk c of every rank
    # before chunk c + 1 of the first); otherwise a unit is a rank.
    units: dict[tuple[int, int], tuple[frozenset, set]] = {}
    merges: dict[frozenset, tuple[RankMerge, str]] = {}
    # No enumerate(): it keeps its last (index, dump) tuple alive while the next rank is read.
    r = -1
    for dump in ranks:
        r += 1
        for c, part in split_chunks(dump):
            mods = frozenset(f"{c}:{e.raw_path}" for e in part.entries if e.kind == "module")
            units[(c, r)] = (mods, layer_numbers(part))
            if mods in merges:
                merges[mods][0].add(part)
            else:
                fam, recs = name_side(part, side.side, namer, family, made)
                merges[mods] = (RankMerge(part, recs, rules), fam)
            del part
        del dump
    order = sorted(units)
    modules = [units[u][0] for u in order]
    has_tokens = [c == 0 and any(st.files[r].tokens is not None for st in side.steps) for c, r in order]
    layout = rank_relation(modules, [units[u][1] for u in order], has_tokens, side.arg, side.side)
    chunked = len(order) != side.n_ranks
    if chunked:
        layout = replace(layout, units=tuple((r, c) for c, r in order))
    stages = [merges[modules[g[0]]][0] for g in layout.stages]
    merged = [m.finish() for m in stages]
    labels = [f"{side.steps[0].files[order[g[0]][1]].rank}" + (f" chunk {order[g[0]][0]}" if chunked else "")
              for g in layout.stages]
    dump = join_stages(merged, list(layout.offsets), labels)
    if side.notes:
        dump = replace(dump, notes=[*side.notes, *dump.notes])
    if len(stages) > 1:
        fam, recs = name_side(dump, side.side, namer, family, made)
    else:
        fam, recs = merges[modules[0]][1], stages[0].recs
    return Side(dump, fam, recs, layout)
