"""Execute the comparison plan (output_2 ``comparisons``) into result records (output_3)."""
from __future__ import annotations

import math
import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..arrays import merge_rule
from ..callruns import call_keys, calls_held, side_leaves
from ..dtypes import dtype_key, is_int_dtype
from ..plan import Carrier, PointPlan
from ..records import Dump, Leaf
from ..skips import Skip
from ..tolerances import grade, pair_tolerances, tolerance_for
from . import bounds as B
from . import params as P
from . import tensors as T
from . import sources
from .lineup import sampled_rows
from .sides import Side, SideStats, StatErrors, with_stats
from .layout import GROUPED, gather_rank_qkv, interleave_parts, qkv_split, regroup_qkv, size_relation, trim_padding
from .logprob import LOGITS_POINT, TOKENS_POINT, LogProbs, token_ids
from .sources import Blocks, Leafsrc, block_ranges
from .stats import ATTRS, Stats, combine, nonfinite_one_side, nonfinite_one_side_calls, stat_error_calls, stat_errors

# Sorting both tensors to test for a permutation needs them whole: only up to this size.
MULTISET_MAX_ELEMENTS = 1 << 22
# Points whose per-token error output_3 keeps in tensor mode: the residual stream after each layer
# and the model's last outputs (rows of the token x layer map of report.html).
PER_TOKEN_POINTS = ("resid_out", "final_norm_out", "logits")


@dataclass
class SideView:
    """What the executor needs from one side: its dump (for tensor files), leaves, family."""
    dump: Dump
    family: str
    leaves: Sequence[Mapping[str, Leaf]]     # per record index: leaf name -> Leaf (leafindex.py)
    paths: list[str]
    keys: list[str]


@dataclass(slots=True)
class Result:
    """One executed comparison (an output_3 row)."""
    cid: str
    point: str
    kind: str
    axis: str
    mode: str                          # statistics | tensor
    status: str                        # match | drift | mismatch | nonfinite | bounded | incomparable | structural
    error: float | None
    tolerance: float | None
    strict_tolerance: float | None
    train: Side | dict[str, Any]     # sides.py; read as the dicts they are written as
    rollout: Side | dict[str, Any]
    stat_errors: StatErrors | dict[str, Any] = field(default_factory=dict)
    tensor_metrics: dict[str, Any] | None = None
    reason: str | None = None
    # A result without notes (nearly all) shares the empty tuple: note() makes its own list.
    notes: list[str] | tuple[str, ...] = ()
    dtype_differs: bool = False
    pair: str | None = None            # set when the comparison reads one pair's own leaves
    calls: dict[str, Any] | None = None  # folded modules: how the calls compared (output_3 ``calls``)
    param_equality: dict[str, Any] | None = None  # parameters only: compare/params.py
    logprob: dict[str, Any] | None = None  # the logits point in tensor mode: per-token log-prob view
    reference: dict[str, Any] | None = None  # parameters with --model: per side, reference.py
    # Why the comparison (or its tensor part) did not happen; ``reason`` repeats its prose.
    skip: Skip | None = None
    # One side one token row more, statistics only: the bounds checked and the one broken (bounds.py).
    bounds: dict[str, Any] | None = None

    def note(self, *texts: str) -> None:
        """Add notes (output_3 ``notes``) after those the result holds."""
        if texts:
            self.notes = [*self.notes, *texts]

    def skipped(self, code: str, reason: str) -> None:
        """Record that the comparison did not happen (a code of skips.SKIP_CODES) and why.

        An unreadable tensor file stays the recorded skip: the statistics fallback that then
        fails (partial sums, one token more) fails only because the tensor was not there.
        """
        if self.skip is None or self.skip.code != "tensor_unavailable":
            self.skip = Skip(code, reason)
        self.reason = reason


def _side(view: SideView, plan: PointPlan, side: str) -> list[Leaf | None]:
    """The plan's leaves of one side: one per call where that side's calls are stitched."""
    return side_leaves(view.leaves, getattr(plan, side), plan.stitched == side)


def leaf_stats(leaf: Leaf, calls: int = 1) -> Stats:
    """The leaf's statistics: call 0's floats, or arrays over its first ``calls`` folded calls."""
    vals = [leaf.max, leaf.min, leaf.mean, leaf.norm]     # ATTRS' order
    if calls > 1:
        vals = [None if v is None else leaf.per_call[:calls, j] for j, v in enumerate(vals)]
    return Stats(*vals, leaf.numel, leaf.dtype, is_int_dtype(leaf.dtype))


def n_calls(leaves: list[Leaf]) -> int:
    """Calls every leaf of one side holds (1 unless all were folded from repeated calls)."""
    return min(lf.per_call.shape[0] if lf.per_call is not None else 1 for lf in leaves)


def _at(s: Stats, i: int) -> Stats:
    return Stats(*[None if getattr(s, a) is None else float(getattr(s, a)[i]) for a in ATTRS],
                 s.numel, s.dtype, s.is_int)


def _describe(view: SideView, carriers: list[Carrier], stitched: bool, shared: dict) -> Side | dict:
    """A result's side (output_3 ``Side``): modules, keys, leaves, dtypes, shapes and merges of the
    carriers; ``shared`` maps a value to the one-element list of it already made."""
    if len(carriers) == 1:
        # Nearly every side of every comparison. Its lists repeat from side to side (a module's calls,
        # its points, a dtype, a shape): each made once and shared, since results are read and never
        # changed once made; 43k sides over many modules held 20 MB of copies.
        c = carriers[0]
        lf = view.leaves[c.rec].get(c.leaf)
        got = [lf]
        path, key, leaf = view.paths[c.rec], view.keys[c.rec], c.leaf
        dtype, merge, shape = (lf.dtype, lf.merge, lf.shape) if lf else (None, None, None)
        get, put = shared.get, shared.setdefault
        modules, keys = get(path) or put(path, [path]), get(key) or put(key, [key])
        leaves = get(leaf) or put(leaf, [leaf])
        dtypes, merges = get(dtype) or put(dtype, [dtype]), get(merge) or put(merge, [merge])
        shapes = get(("shape", shape)) or put(("shape", shape), [list(shape) if shape is not None else None])
    else:
        got = [view.leaves[c.rec].get(c.leaf) for c in carriers]
        modules, keys = [view.paths[c.rec] for c in carriers], [view.keys[c.rec] for c in carriers]
        leaves, dtypes = [c.leaf for c in carriers], [lf.dtype if lf else None for lf in got]
        shapes = [list(lf.shape) if lf and lf.shape is not None else None for lf in got]
        merges = [lf.merge if lf else None for lf in got]
    # merges: how tensor-parallel ranks were joined into each leaf (unshard.py); null: one rank.
    if stitched:
        runs = [calls_held(lf) for lf in got]
        if max(runs, default=1) > 1:
            # A stitched record that the loader folded holds several calls, from its key on: a dict,
            # as the few sides with a member the record lacks.
            return {"modules": modules, "keys": keys, "leaves": leaves, "dtypes": dtypes, "shapes": shapes,
                    "merges": merges, "calls": runs}
    return Side(modules, keys, leaves, dtypes, shapes, merges)


def side_call_keys(side: dict) -> list[str]:
    """The dump key of every call a result's side read, runs taken apart (``Side.calls``)."""
    runs = side.get("calls") or [1] * len(side["keys"])
    return [k for key, n in zip(side["keys"], runs) for k in call_keys(key, n)]


def _shapes_text(side: dict) -> str:
    """A side's shapes for a message; a folded run of calls is one shape repeated, so its length
    is said with it (the element count covers every call)."""
    runs = side.get("calls")
    if not runs:
        return str(side["shapes"])
    return "[" + ", ".join(f"{s} x {n} calls" if n > 1 else str(s) for s, n in zip(side["shapes"], runs)) + "]"


def _side_stats(s: Stats) -> SideStats:
    return SideStats(s.max, s.min, s.mean, s.norm, s.numel)


class Executor:
    """Runs planned comparisons with the tolerances and tensor access of both sides."""

    def __init__(self, train: SideView, rollout: SideView, tolerances: dict, use_tensors: bool = True,
                 jobs: int = 1, given_ids: list[int] | None = None, bounds: bool = True,
                 temperature: float | None = None):
        self.t, self.r, self.tol = train, rollout, tolerances
        self.temperature = temperature                           # --logprob-temperature
        self.use_tensors = use_tensors
        self.jobs = jobs
        self.given = given_ids                                   # --token-ids: the whole sequence
        # Statistics of a side holding one token row more are held to bounds (bounds.py), not skipped.
        self.bounds = bounds
        self.ids: tuple[np.ndarray, int | None] | None = None   # shared token ids, prompt length
        self._stat_tol: dict[tuple, tuple[float, float]] = {}
        self._shared: dict = {}                                  # _describe's shared lists

    def run(self, plans: list[PointPlan]) -> list[Result]:
        """Execute every plan; results in plan order.

        With ``jobs`` > 1 (tensor files present) the comparisons are spread over that many forked
        processes (threads gained nothing: much of a block's work holds the GIL). Each process
        reads its own blocks, so memory grows by one block budget per job.
        """
        if self.use_tensors:
            self.ids = self._token_ids(plans)
        if self.jobs <= 1 or len(plans) < 2 or "fork" not in multiprocessing.get_all_start_methods():
            return [self.run_one(p) for p in plans]
        global _FORKED
        _FORKED = (self, plans)
        try:
            with ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("fork")) as pool:
                return list(pool.map(_run_forked, range(len(plans))))
        finally:
            _FORKED = None

    def run_one(self, plan: PointPlan) -> Result:
        """Execute one planned comparison."""
        tl, rl = _side(self.t, plan, "train"), _side(self.r, plan, "rollout")
        notes, trim = [], None
        rows = None
        if plan.stitched and None not in tl + rl:
            tl, rl, notes, trim = _fit_calls(plan, tl, rl)
            rows = self._sampled_lineup(plan, tl, rl) if trim is None else None
            if rows is not None:
                notes = [f"the {plan.stitched} side's logits rows are the sampled ones (last prompt position, "
                         f"then one per decode call): lined up with the other side's rows {rows.start}.."
                         f"{rows.stop - 1}"]
        res = Result(plan.cid, plan.point, plan.kind, plan.axis, "statistics", "incomparable", None, None, None,
                     _describe(self.t, plan.train, plan.stitched == "train", self._shared),
                     _describe(self.r, plan.rollout, plan.stitched == "rollout", self._shared), pair=plan.pair)
        res.note(*notes)
        if any(lf is None for lf in tl + rl):
            res.skipped("missing_leaf", "a planned leaf is missing from the dump")
            return res
        kt, kr = n_calls(tl), n_calls(rl)
        k = min(kt, kr)
        rep = kv_replication(plan.point, tl, rl)
        tparts, rparts = [leaf_stats(x, k) for x in tl], [leaf_stats(x, k) for x in rl]
        if rep is not None:
            side, r = rep
            # The parts side's statistics as the merged fused side lays them out: k and v r times.
            parts = tparts if side == "train" else rparts
            parts[:] = [parts[0]] + [parts[1]] * r + [parts[2]] * r
            res.note(f"k and v replicated on {r} tensor-parallel ranks (fewer KV heads than ranks): "
                             f"the {side} parts are combined with k and v counted {r} times")
        ts, rs = combine(tparts), combine(rparts)
        if rep is None and fused_kv_replicated(plan.point, tl, rl):
            # Max and Min ignore duplicates; Mean and Norm need the parts, which the dump lacks.
            ts, rs = (replace(x, mean=None, norm=None, numel=None) for x in (ts, rs))
            rep = ("both", 0)
            res.note("only Max/Min compared: one side's fused qkv holds replicated KV heads (fewer KV "
                             "heads than tensor-parallel ranks) and the dump has no per-part statistics")
        errors = None
        if max(kt, kr) > 1:
            ts, rs, errors = self._pick_call(res, ts, rs, kt, kr, k, tl[0].dtype, rl[0].dtype)
        res.train, res.rollout = with_stats(res.train, _side_stats(ts)), with_stats(res.rollout, _side_stats(rs))
        dt, dr = tl[0].dtype, rl[0].dtype
        res.dtype_differs = dtype_key(dt) != dtype_key(dr)
        if is_int_dtype(dt) != is_int_dtype(dr):
            res.skipped("dtype_conflict", f"dtype conflict: {dt} vs {dr}")
            return res
        tensors = self._tensors(plan, tl, rl, res) if self.use_tensors and rep is None else None
        if rep is not None and self.use_tensors and all(lf.data_name for lf in tl + rl):
            res.note("replicated KV heads are compared by statistics (tensor regrouping not done)")
        if tensors is None and trim and self.bounds and self._judge_bounds(res, trim, tparts, rparts, tl, rl, dt, dr):
            return res
        if tensors is None and trim:
            res.skipped("extra_token", f"the {trim} side holds one token more (the last sampled token, which the "
                        "engine returns and never feeds back): statistics over different tokens do not compare; "
                        "use tensor mode, or dump the trainer without the last token")
            return res
        if tensors is None and any(lf.merge and merge_rule(lf.merge).is_sum for lf in tl + rl):
            res.skipped("partial_sums", "partial sums across tensor-parallel ranks: their statistics cannot be "
                        "combined; compare a tensor dump, or dump after the all-reduce")
            return res
        if tensors is not None:
            self._judge_tensor(plan, res, tensors, dt, dr, tl, rl, trim, rows)
        else:
            self._judge_stats(plan, res, ts, rs, dt, dr, errors)
        if plan.axis == "rows" and res.status in ("match", "drift", "mismatch"):
            self._judge_parameter(res, ts, rs, dt, dr, tl, rl, plan.train_layout == plan.rollout_layout)
        return res

    def _judge_parameter(self, res: Result, ts: Stats, rs: Stats, dt, dr, tl, rl, same_layout: bool) -> None:
        """Say whether the two parameters are the same tensor; a proven difference is a mismatch
        whatever the scaled statistics error (a stale bf16 weight moves Max by one bf16 step)."""
        # A digest is of the bytes as stored: equal tensors in two layouts (Megatron's grouped qkv)
        # have different digests.
        eq = P.by_checksum(tl, rl) if same_layout else None
        if eq is None and res.mode == "tensor" and res.tensor_metrics:
            eq = P.by_tensor(res.tensor_metrics.get("max_abs"))
        if eq is None:
            eq = P.by_statistics(ts, rs, dtype_key(dt), dtype_key(dr), res.status != "mismatch")
        res.param_equality = eq
        if eq["equal"] is False and eq["exact"] and res.status != "mismatch" and eq["how"] != "tensor":
            res.status = "mismatch"
            res.reason = f"parameters differ: {eq['detail']}"

    # -- statistics ---------------------------------------------------------------------
    def _pick_call(self, res: Result, ts: Stats, rs: Stats, kt: int, kr: int, k: int, dt, dr):
        """Grade every compared call of folded modules; the worst call is the one reported and judged."""
        tol, strict = pair_tolerances(self.tol["statistics"], dt, dr)
        per_call = stat_error_calls(ts, rs)
        err = per_call["scaled_error"]
        with np.errstate(invalid="ignore"):
            sev = np.select([nonfinite_one_side_calls(ts, rs), np.isnan(err), ~(err <= tol), err > strict],
                            [3, -1, 2, 1], 0)
        if ts.numel == 0 and rs.numel == 0:
            sev[:] = 0
        # The most severe call, and of those the first: it is what output_3 shows and judges.
        worst = int(np.flatnonzero(sev == sev.max())[0])
        bad = np.flatnonzero(sev >= 2)
        res.calls = {"train": kt, "rollout": kr, "compared": k, "reported": worst,
                     "first_diverged": int(bad[0]) if bad.size else None,
                     "counts": {name: int((sev == code).sum()) for name, code in
                                (("match", 0), ("drift", 1), ("mismatch", 2), ("nonfinite", 3),
                                 ("incomparable", -1)) if (sev == code).any()}}
        if kt != kr:
            res.note(f"train has {kt} calls, rollout {kr}: the first {k} are compared call by call")
        errors = StatErrors(**{name: None if math.isnan(v[worst]) else float(v[worst]) for name, v in per_call.items()})
        return (_at(ts, worst), _at(rs, worst), errors) if k > 1 else (ts, rs, errors)

    def _stat_tolerances(self, dt, dr) -> tuple[float, float]:
        """pair_tolerances of the statistics table, kept per dtype pair (asked once per comparison)."""
        got = self._stat_tol.get((dt, dr))
        if got is None:
            got = self._stat_tol[(dt, dr)] = pair_tolerances(self.tol["statistics"], dt, dr)
        return got

    def _judge_stats(self, plan, res: Result, ts: Stats, rs: Stats, dt, dr, errors: StatErrors | None = None) -> None:
        tol, strict = self._stat_tolerances(dt, dr)
        res.tolerance, res.strict_tolerance = tol, strict
        if ts.numel is not None and rs.numel is not None and ts.numel != rs.numel:
            if 0 in (ts.numel, rs.numel) and plan.axis == "rows":
                # An engine that keeps a weight only in a kernel format dumps an empty tensor (vLLM's
                # CPU build prepacks linear weights into [0]): nothing to see, not another size.
                side = "train" if ts.numel == 0 else "rollout"
                res.skipped("no_statistics", f"not visible: the {side} parameter holds no element (a weight "
                            "kept only in a kernel format, such as vLLM CPU's prepacked linears)")
            else:
                self._size_conflict(plan, res, ts, rs)
            return
        res.stat_errors = errors if errors is not None else stat_errors(ts, rs)
        if nonfinite_one_side(ts, rs):
            res.status, res.error = "nonfinite", math.inf
            res.reason = "NaN/Inf on one side only"
            return
        err = res.stat_errors.get("scaled_error")
        if err is None:
            if ts.numel == 0 and rs.numel == 0:
                res.status, res.error, res.reason = "match", 0.0, "both tensors are empty"
            else:
                res.skipped("no_statistics", "no statistics to compare (empty, fake or checksum-only tensor)")
            return
        res.error = err
        res.status = grade(err, tol, strict)

    def _judge_bounds(self, res: Result, trim: str, tparts: list[Stats], rparts: list[Stats], tl, rl,
                      dt, dr) -> bool:
        """Hold the stitched side's calls to the bounds the other side's statistics set, that side
        holding one token row more (bounds.py); False when they cannot be checked."""
        pieces, whole, leaves = (rparts, combine(tparts), rl) if trim == "train" else (tparts, combine(rparts), tl)
        # Integer ids are exact, as in the equal-token comparison (stats.py).
        tol, strict = (0.0, 0.0) if is_int_dtype(dt) else pair_tolerances(self.tol["statistics"], dt, dr)
        v = B.judge(pieces, whole, leaves[-1].numel or 0, tol)
        if v is None:
            return False
        side = "rollout" if trim == "train" else "train"
        keys = side_call_keys(res.rollout if side == "rollout" else res.train)
        # A piece is a call when the side holds one leaf per call (not parts of a fused tensor).
        call = v.piece if v.piece is not None and len(set(keys)) == len(pieces) else None
        res.status, res.error, res.tolerance, res.strict_tolerance = v.status, v.error, tol, strict
        res.bounds = {"rows_of": side, "whole": trim, "checked": v.checked, "broken": v.broken,
                      "call": call, "key": keys[call] if call is not None else None}
        if v.status == "bounded":
            res.reason = (f"consistent, not verified: the {trim} side holds one token more (the last sampled "
                          f"token, never fed to the engine), so statistics over different tokens only bound each "
                          f"other; the {side} calls' {', '.join(v.checked)} hold within tolerance of the {trim} "
                          "side's; verify with tensor mode, or with --model and --token-ids")
        else:
            where = f" at {side} call {call} ({keys[call]})" if call is not None else ""
            res.reason = (f"bound broken{where}: {v.detail}; the {side} side's tokens are the {trim} side's "
                          f"but its last, so no rounding within tolerance explains this ({v.broken})")
        return True

    def _size_conflict(self, plan, res: Result, ts: Stats, rs: Stats) -> None:
        tshape, rshape = res.train["shapes"], res.rollout["shapes"]
        kind, detail = (size_relation(plan.point, tshape[0], rshape[0])
                        if plan.kind == "direct" else (None, None))
        if kind == "tp_shard":
            res.status = "structural"
            res.skipped("tp_shard", f"tp_shard: one side holds 1/{detail} of the other along one dimension "
                        f"({tshape} vs {rshape}); gather the shards before comparing")
        elif kind == "padded_vocab":
            res.status = "structural"
            res.skipped("padded_vocab", f"padded_vocab: vocabulary padded on one side ({tshape} vs {rshape})")
            res.stat_errors = {"norm_rel": abs(ts.norm - rs.norm) / max(ts.norm, rs.norm)
                               if ts.norm and rs.norm else None}
        else:
            res.skipped("shape_conflict", f"shape conflict: {ts.numel} vs {rs.numel} elements "
                        f"({_shapes_text(res.train)} vs {_shapes_text(res.rollout)})")

    # -- tensors --------------------------------------------------------------------------
    def _tensors(self, plan, tl, rl, res: Result):
        from .. import tensorio
        out = []
        for view, leaves, carriers in ((self.t, tl, plan.train), (self.r, rl, plan.rollout)):
            arrs = []
            for lf in leaves:
                if not lf.data_name:
                    return None
                files = lf.shards or ((view.dump.dump_dir, lf.data_name, view.dump.dump_data_dir),)
                try:
                    opened = [tensorio.open_tensor(tensorio.resolve_data_file(*f)) for f in files]
                except tensorio.TensorReadError as exc:
                    res.note(f"tensor unavailable, statistics used instead: {exc}")
                    res.skip = Skip("tensor_unavailable", str(exc))
                    return None
                if len({raw for _, raw in opened}) > 1:       # ranks stored in different dtypes
                    opened = [(tensorio.widen_bf16(a) if raw else a, False) for a, raw in opened]
                arrs.append(Leafsrc([a for a, _ in opened], lf.merge, opened[0][1]))
            out.append(arrs)
        return out

    def _token_ids(self, plans: list[PointPlan]) -> tuple[np.ndarray, int | None] | None:
        """The token ids both sides saw (from the tokens point's tensors) and the prompt length.

        The prompt length is known when one side's calls were stitched (prefill, then decode
        steps): its first call holds the prompt. The ids are the whole sequence: the longest of the
        two sides' and ``--token-ids`` (logprob.token_ids), which also hold the last sampled token.
        """
        given = None if self.given is None else np.asarray(self.given, np.int64)
        plan = next((p for p in plans if p.point == TOKENS_POINT and p.pair is None), None)
        tl = _side(self.t, plan, "train") if plan else [None]
        rl = _side(self.r, plan, "rollout") if plan else [None]
        tensors = (self._tensors(plan, tl, rl, Result("", "", "", "", "", "", None, None, None, {}, {}))
                   if None not in tl + rl else None)
        if tensors is None:
            return (given, None) if given is not None else None
        flat = [np.concatenate([T.as_tokens(x.whole(), view.family).reshape(-1) for x in side])
                for side, view in zip(tensors, (self.t, self.r))]
        # Ids the user gave that contradict the dumps are set aside: the dumps show what ran.
        ids = token_ids(*flat, given)
        ids = token_ids(*flat) if ids is None and given is not None else ids
        if ids is None:
            return None
        stitched = tl if plan.stitched == "train" else rl if plan.stitched == "rollout" else None
        prompt = stitched[0].numel if stitched and len(stitched) > 1 else None
        return ids, prompt

    def _sampled_lineup(self, plan, tl: list[Leaf], rl: list[Leaf]) -> slice | None:
        """The other side's logits rows that a stitched engine side's sampled rows stand for, when
        the two sides' token counts differ (lineup.py); None for any other point or layout."""
        if plan.point != LOGITS_POINT or plan.pair is not None or self.ids is None or self.ids[1] is None:
            return None
        many, full = (tl, rl) if plan.stitched == "train" else (rl, tl)
        rows = [_rows(lf) for lf in many]
        if len(full) != 1 or None in rows or sum(rows) == _rows(full[0]) or any(n != 1 for n in rows[1:]):
            return None
        return sampled_rows(self.ids[1], rows[0], len(rows) - 1, _rows(full[0]) or 0)

    def _judge_tensor(self, plan, res: Result, tensors, dt, dr, tl, rl, trim: str | None = None,
                      rows: slice | None = None) -> None:
        res.mode = "tensor"
        tol, strict = pair_tolerances(self.tol["tensor"]["rel_l2"], dt, dr)
        el = self.tol["tensor"]["elementwise"]
        elt = max((tolerance_for(el, dt), tolerance_for(el, dr)), key=lambda d: d["rtol"])
        res.tolerance, res.strict_tolerance = tol, strict
        own = plan.pair is None and plan.axis == "features"
        acc = T.Metrics(elt["rtol"], elt["atol"], per_token=own and plan.point.endswith(PER_TOKEN_POINTS))
        lps = (LogProbs(self.ids[0], elt["rtol"], elt["atol"], self.ids[1], self.temperature)
               if own and plan.point == LOGITS_POINT and self.ids is not None else None)
        moments = (T.Moments(), T.Moments())
        nonfinite, notes, streamed = False, [], False
        for tarrs, rarrs, row0, blocked in self._blocks(plan, *tensors):
            streamed = streamed or blocked
            row0 += rows.start if rows is not None else 0     # lined-up rows keep their positions
            try:
                t, r, note = self._assemble(plan, tarrs, rarrs, elt, tl, rl, blocked, trim, rows)
            except ValueError as exc:
                kind, detail = (size_relation(plan.point, tarrs[0].shape, rarrs[0].shape)
                                if plan.kind == "direct" else (None, None))
                if kind == "padded_vocab":
                    t, r = trim_padding(tarrs[0], rarrs[0], detail)
                    t, r = t.astype(np.float64), r.astype(np.float64)
                    note = "padded vocabulary rows trimmed before comparing"
                elif kind == "tp_shard":
                    res.status = "structural"
                    res.skipped("tp_shard", f"tp_shard: one side holds 1/{detail} of the other along one "
                                "dimension; gather the shards before comparing")
                    return
                else:
                    res.skipped("shape_conflict" if isinstance(exc, T.ShapeConflict) else "layout", str(exc))
                    return
            if note and note not in notes:
                notes.append(note)
            # Layout steps may hand back the dump's dtype; metrics in float32 would lose 1e-8 of cosine.
            t, r = np.asarray(t, dtype=np.float64), np.asarray(r, dtype=np.float64)
            moments[0].add(t)
            moments[1].add(r)
            if np.isfinite(moments[0].sum + moments[1].sum):
                acc.add(t, r, row0)       # all finite: nothing to mask
                if lps is not None:
                    lps.add(t, r, row0)
            else:
                lps = None
                fin_t, fin_r = np.isfinite(t), np.isfinite(r)
                nonfinite = nonfinite or bool((fin_t != fin_r).any())
                acc.add(np.where(fin_t, t, 0.0), np.where(fin_r, r, 0.0), row0)
        res.note(*notes)
        res.train, res.rollout = (with_stats(side, SideStats(*mom.result(), mom.size))
                                  for side, mom in zip((res.train, res.rollout), moments))
        if streamed:
            res.note("compared block by block along the "
                             + ("tokens" if plan.axis == "features" else "rows or columns"))
        if nonfinite:
            res.status, res.error, res.reason = "nonfinite", math.inf, "NaN/Inf on one side only"
            return
        m = acc.result()
        res.tensor_metrics = m
        res.logprob = lps.result() if lps is not None else None
        res.error = m["rel_l2"]
        res.status = grade(m["rel_l2"], tol, strict)
        if res.status == "mismatch":
            m["multiset_equal"] = self._multiset(plan, tensors, elt, tl, rl, rows)

    def _blocks(self, plan, tsrc: list[Leafsrc], rsrc: list[Leafsrc]):
        """Yield (train arrays, rollout arrays, first row, blocked): one whole pair, or blocks."""
        tokens = plan.axis == "features"
        regroup = (GROUPED in (plan.train_layout, plan.rollout_layout) or _rank_groups(tsrc) > 1
                   or _rank_groups(rsrc) > 1)
        mode = "tokens" if tokens else "columns" if regroup else "rows"
        sides = [Blocks(tsrc, self.t.family, mode, plan.stitched == "train"),
                 Blocks(rsrc, self.r.family, mode, plan.stitched == "rollout")]
        sizes = [sum(x.size for x in tsrc), sum(x.size for x in rsrc)]
        n = sides[0].length()
        if (max(sizes) * 8 <= sources.BLOCK_BYTES or n is None or n < 4 or n != sides[1].length()
                or not all(b.streamable() for b in sides)):
            yield [x.whole() for x in tsrc], [x.whole() for x in rsrc], 0, False
            return
        for lo, hi in block_ranges(n, 8 * max(sizes) // n):
            yield *(b.take(lo, hi) for b in sides), 0 if mode == "columns" else lo, True
            for b in sides:
                b.release()

    def _head_geometry(self, plan) -> tuple[int | None, int | None]:
        """(head_dim, q heads per k head) from the leaves the plan names, None where unknown."""
        head_dim, heads = None, {}
        for what, side, c in plan.heads:
            lf = (self.t if side == "train" else self.r).leaves[c.rec].get(c.leaf)
            shape = [d for d in (lf.shape or ()) if d != 1] if lf is not None else []
            if what == "norm" and len(shape) == 1:
                head_dim = head_dim or shape[0]
            elif what != "norm" and len(shape) >= 3:     # [tokens, (batch,) heads, head_dim]
                head_dim = head_dim or shape[-1]
                heads[what] = shape[-2]
        q, k = heads.get("q"), heads.get("k")
        per_group = q // k if q and k and q % k == 0 else None
        return head_dim, per_group

    def _multiset(self, plan, tensors, elt, tl, rl, rows: slice | None = None) -> bool | None:
        """Same values in another order? Needs whole tensors: skipped (None) for very large ones."""
        if max(sum(x.size for x in side) for side in tensors) > MULTISET_MAX_ELEMENTS:
            return None
        try:
            t, r, _ = self._assemble(plan, [x.whole() for x in tensors[0]], [x.whole() for x in tensors[1]],
                                     elt, tl, rl, False, rows=rows)
        except ValueError:
            return None
        return T.same_multiset(t, r, elt["rtol"], elt["atol"])

    def _assemble(self, plan, tarrs, rarrs, elt, tl, rl, blocked: bool, trim: str | None = None,
                  rows: slice | None = None):
        """Join the parts of each side and bring both to one layout (blocks come in token form).

        ``trim`` names a side holding one token more than the other fed (the last sampled token):
        its last token row is left out. ``rows``: the unstitched side's rows that the stitched
        side's sampled logits rows line up with (lineup.py); only those are kept.
        """
        cat_axis = 0 if plan.axis == "rows" else -1
        if plan.axis == "features" and not blocked:
            tarrs = [T.as_tokens(a, self.t.family) for a in tarrs]
            rarrs = [T.as_tokens(a, self.r.family) for a in rarrs]
            # Calls 0..n of one side (prefill, then decode steps) make one token sequence.
            if plan.stitched == "train" and len(tarrs) > 1:
                tarrs = [np.concatenate(tarrs, axis=0)]
            elif plan.stitched == "rollout" and len(rarrs) > 1:
                rarrs = [np.concatenate(rarrs, axis=0)]
            # The trimmed side is never the stitched one: each of its parts holds every token.
            if trim == "train":
                tarrs = [a[:-1] for a in tarrs]
            elif trim == "rollout":
                rarrs = [a[:-1] for a in rarrs]
            if rows is not None and plan.stitched == "rollout":
                tarrs = [a[rows] for a in tarrs]
            elif rows is not None:
                rarrs = [a[rows] for a in rarrs]
        if plan.kind == "composite":
            # A fused output merged from R ranks is [part0_r0, part1_r0, ..., part0_r1, ...]:
            # lay the other side's parts out the same way.
            if len(tarrs) == 1 and (g := _rank_groups(tl)) > 1:
                rarrs = [interleave_parts(rarrs, g, cat_axis)]
            elif len(rarrs) == 1 and (g := _rank_groups(rl)) > 1:
                tarrs = [interleave_parts(tarrs, g, cat_axis)]
        t = np.concatenate(tarrs, axis=cat_axis) if len(tarrs) > 1 else tarrs[0]
        r = np.concatenate(rarrs, axis=cat_axis) if len(rarrs) > 1 else rarrs[0]
        if (plan.train_layout == GROUPED) != (plan.rollout_layout == GROUPED) and t.shape == r.shape:
            # One side packs qkv per query group (Megatron), the other as [q; k; v].
            grouped_is_train = plan.train_layout == GROUPED
            standard, parts = (r, rarrs) if grouped_is_train else (t, tarrs)
            sizes = ([p.shape[cat_axis] for p in parts[:2]] if len(parts) == 3 else [None, None])
            head_dim, per_group = self._head_geometry(plan)
            ranks = _rank_groups(rl if grouped_is_train else tl) if len(parts) == 1 else 1
            if ranks > 1:
                # The standard side is fused per rank ([q_r; k_r; v_r] after one another).
                gathered = gather_rank_qkv(standard, ranks, cat_axis, head_dim, per_group)
                if gathered is None:
                    raise ValueError(f"{GROUPED}: cannot split the {ranks} ranks' fused qkv blocks (head size "
                                     f"{head_dim}, {per_group} q heads per k head)")
                standard = gathered
            split = qkv_split(standard.shape[cat_axis], *sizes, head_dim, per_group)
            if split is None:
                raise ValueError(f"{GROUPED}: cannot regroup qkv, the dump does not show the head size "
                                 f"(no attention-kernel q/k inputs or q/k norm weights in layer "
                                 f"{plan.point.split('.')[0]}) or it does not divide the {standard.shape[cat_axis]} rows")
            regrouped = regroup_qkv(standard, cat_axis, split)
            t, r = (t, regrouped) if grouped_is_train else (regrouped, r)
            return t, r, (f"parts regrouped to the Megatron per-group qkv layout (head_dim={head_dim}, "
                          f"{split[2]} query groups)")
        fam_t = "vllm" if plan.axis == "features" else self.t.family
        fam_r = "vllm" if plan.axis == "features" else self.r.family
        return T.align(t, r, fam_t, fam_r, plan.axis)


# The executor and plans a forked worker inherits (set only while Executor.run spreads work).
_FORKED: tuple | None = None


def _run_forked(i: int) -> Result:
    executor, plans = _FORKED
    return executor.run_one(plans[i])


def kv_replication(point: str, tl: list[Leaf], rl: list[Leaf]) -> tuple[str, int] | None:
    """(parts side, r) when a fused q|k|v merged from tensor-parallel ranks holds k and v r times.

    With fewer KV heads than TP ranks, vLLM, SGLang and Megatron give each rank a copy of its KV
    head(s), so rank r's fused shard is [q_r; k; v] and the merged tensor holds k and v r times.
    Its size tells r: numel = q + r * (k + v) (references/tensor_parallel.md).
    """
    if point.count("+") != 2:        # nearly every point: not three parts
        return None
    names = point.split("+")
    if not [n.split(".")[1] for n in names if n.count(".") >= 1] == ["q", "k", "v"]:
        return None
    for side, parts, fused in (("train", tl, rl), ("rollout", rl, tl)):
        if len(parts) != 3 or len(fused) != 1 or not merge_rule(fused[0].merge).is_concat:
            continue
        nq, nk, nv, nf = (lf.numel for lf in (*parts, fused[0]))
        if None in (nq, nk, nv, nf) or nk + nv == 0 or nf <= nq + nk + nv:
            continue
        r, rem = divmod(nf - nq, nk + nv)
        if rem == 0 and r > 1 and len(fused[0].shards or ()) % r == 0:
            return side, r
    return None


def fused_kv_replicated(point: str, tl: list[Leaf], rl: list[Leaf]) -> bool:
    """Both sides fused q|k|v, one merged from R ranks and larger than the other but smaller than R
    copies of it: the merged side repeats KV heads that fewer KV heads than ranks replicate."""
    if point.count("+") != 2:
        return False
    names = point.split("+")
    if [n.split(".")[1] if n.count(".") else "" for n in names] != ["q", "k", "v"]:
        return False
    if len(tl) != 1 or len(rl) != 1:
        return False
    for one, merged in ((tl[0], rl[0]), (rl[0], tl[0])):
        ranks = int(merge_rule(merged.merge).is_concat) and max(len(merged.shards or ()), 2)
        if ranks and one.numel and merged.numel and one.numel < merged.numel < ranks * one.numel:
            return True
    return False


def _fit_calls(plan, tl: list[Leaf], rl: list[Leaf]):
    """Match the stitched side's calls to the other side's tokens.

    Returns (train leaves, rollout leaves, notes, side whose last token is left out or None). All
    calls when the counts agree; only the first call when the other side saw only those tokens (the
    prompt); all calls with the other side's last token left out when it holds one token more (a
    trainer scoring the whole sequence feeds the last sampled token, which the engine never fed).
    """
    many, one = (tl, rl) if plan.stitched == "train" else (rl, tl)
    total = sum(lf.numel or 0 for lf in many)
    other = sum(lf.numel or 0 for lf in one)
    if total == other or len(many) < 2:
        return tl, rl, [f"{plan.stitched} calls 0..{len(many) - 1} stitched along the tokens"], None
    one_token = many[-1].numel or 0
    if one_token and other - total == one_token:
        other_side = "rollout" if plan.stitched == "train" else "train"
        return tl, rl, [f"{plan.stitched} calls 0..{len(many) - 1} stitched along the tokens; the {other_side} "
                        f"side's last token (the last sampled one, never fed to the engine) left out"], other_side
    if many[0].numel == other:
        many = many[:1]
        note = "the other side saw only the first call's tokens (the prompt): compared with that call"
    else:
        note = (f"token counts cannot be reconciled: {plan.stitched} calls hold "
                f"{[lf.numel for lf in many]} elements, the other side {other}")
    return ((many, rl, [note], None) if plan.stitched == "train" else (tl, many, [note], None))


def _rows(lf: Leaf) -> int | None:
    """Rows of a [tokens, vocab] leaf (leading batch dimensions of 1 included), None when unknown."""
    if lf.shape is None or lf.numel is None or not lf.shape or not lf.shape[-1]:
        return None
    return lf.numel // lf.shape[-1]


def _rank_groups(leaves: list[Leaf]) -> int:
    """Ranks whose shards were concatenated into a fused leaf (each holds its own [part_r ...])."""
    lf = leaves[0] if len(leaves) == 1 else None
    if lf is None or not merge_rule(lf.merge).is_concat or not lf.shards:
        return 1
    return len(lf.shards)

