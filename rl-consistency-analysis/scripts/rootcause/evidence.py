"""Read the sibling's documented outputs (output_2..4 JSON) into plain lookups."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_MAJORS = ("1", "2")   # 2.0 adds optional fields only (sources steps/files, logprob, per_token)


class EvidenceError(Exception):
    """An output file is missing, unreadable or of an unsupported schema version."""


_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# Numeric fields the sibling writes as strings when they are not finite (output_schemas.md).
_NUMERIC_KEYS = {"error", "margin", "amplification", "input_error", "parameter_error", "output_error",
                 "tolerance", "strict_tolerance"}


def _numbers(obj: dict) -> dict:
    """The sibling's 'NaN'/'Infinity' strings turned back into floats in a JSON object's numeric
    fields; the object itself when it has none.

    The parser's object hook: it is called once per object, innermost first, so every object of a
    file is seen once, and only one holding such a string is copied. A walk over every value of
    the parsed files, copying each, took longer than parsing them on a pair of many modules.
    """
    if _NUMERIC_KEYS.isdisjoint(obj):
        return obj
    swap = {k: _NONFINITE[v] for k in _NUMERIC_KEYS.intersection(obj) if type(v := obj[k]) is str and v in _NONFINITE}
    return {**obj, **swap} if swap else obj


def _read(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"), object_hook=_numbers)
    except FileNotFoundError:
        raise EvidenceError(f"{path}: missing (the compare step did not write it)") from None
    except (OSError, ValueError) as exc:
        raise EvidenceError(f"{path}: unreadable ({exc})") from None
    ver = str(doc.get("schema_version", ""))
    if ver.split(".")[0] not in SUPPORTED_MAJORS:
        raise EvidenceError(f"{path}: schema_version {ver!r} is not supported "
                            f"(need {' or '.join(m + '.x' for m in SUPPORTED_MAJORS)})")
    return doc


@dataclass(frozen=True)
class Vocabulary:
    """output_4 ``vocabulary``: the words the compare skill owns and publishes, read instead of
    re-derived (its references/output_schemas.md)."""
    clean: tuple[str, ...]          # result statuses that say the sides agree within tolerance
    diverged: tuple[str, ...]       # those that say they differ
    dtype_precision: tuple[str, ...]   # floating dtypes, most precise first
    point_words: dict               # a point's name inside its scope -> words
    points: dict                    # point name -> its parsed form (kind, layer, parts)

    @property
    def graded(self) -> tuple[str, ...]:
        """The statuses of a comparison that was graded against its tolerance (clean or diverged)."""
        return self.clean + self.diverged

    def precision(self, dtype: str | None) -> int:
        """How precise a dtype is: higher is more precise, 0 for a dtype the order does not list."""
        order = self.dtype_precision
        return len(order) - order.index(dtype) if dtype in order else 0

    def form(self, point: str) -> dict | None:
        """The published form of a point name (None for a name output_4 does not list)."""
        return self.points.get(point)

    def parts(self, point: str) -> list[str]:
        """The part names of a (possibly fused) point; the name itself when it is not published."""
        form = self.points.get(point)
        return [p["point"] for p in form["parts"]] if form else [point]


def _vocabulary(path: Path, doc: dict) -> Vocabulary:
    """The ``vocabulary`` of output_4 (2.2); a file without it, or with a malformed one, is an
    EvidenceError (the triage would otherwise guess the words it means)."""
    v = doc.get("vocabulary")
    if not isinstance(v, dict) or not _VOCABULARY_KEYS <= set(v):
        raise EvidenceError(f"{path}: no 'vocabulary' with {', '.join(sorted(_VOCABULARY_KEYS))} (written by a "
                            "compare step older than output_4 2.1: rerun it)")
    st, forms = v["statuses"], v["points"]
    bad = [] if isinstance(st, dict) and all(isinstance(st.get(k), list) for k in ("clean", "diverged")) \
        else ["statuses needs clean and diverged lists"]
    bad += [f"{k} is not {t.__name__}" for k, t in (("dtype_precision", list), ("point_words", dict), ("points", dict))
            if not isinstance(v[k], t)]
    if not bad:
        bad = [f"points[{p!r}] is not a form" for p, f in forms.items() if not _is_form(f)][:1]
    if bad:
        raise EvidenceError(f"{path}: vocabulary: {bad[0]}")
    return Vocabulary(tuple(st["clean"]), tuple(st["diverged"]), tuple(v["dtype_precision"]), v["point_words"], forms)


_VOCABULARY_KEYS = {"statuses", "dtype_precision", "point_words", "points"}
_PART_KEYS = {"point", "scope", "layer", "name", "parameter", "call"}


def _is_form(form) -> bool:
    """A published point form: kind, layer and a non-empty list of parts with every key."""
    parts = form.get("parts") if isinstance(form, dict) else None
    return isinstance(parts, list) and bool(parts) and {"kind", "layer"} <= set(form) \
        and all(isinstance(p, dict) and _PART_KEYS <= set(p) for p in parts)


@dataclass
class Evidence:
    """Everything the triage reads, indexed for lookups."""
    mapping: dict
    compare: dict
    analysis: dict
    modules: list[dict] = field(default_factory=list)
    pos: dict[str, int] = field(default_factory=dict)          # pair id -> position in train order
    results: dict[str, dict] = field(default_factory=dict)     # cid -> output_3 result
    one_sided: dict[tuple[str, str], dict] = field(default_factory=dict)   # (side, key) -> output_4 one-sided
    sources: dict = field(default_factory=dict)                # output_1 sources: what each side read
    key_rows: dict = field(default_factory=dict)               # output_1 per side: each module call and its ports
    vocab: Vocabulary | None = None                            # output_4 vocabulary (set by load)

    @property
    def mode(self) -> str:
        return self.compare.get("mode", "statistics")

    def pair(self, pid: str | None) -> dict | None:
        """The output_4 record of pair ``pid`` (None for None)."""
        return None if pid is None else self.modules[self.pos[pid]]

    def one_sided_of(self, refs: list[dict]) -> list[dict]:
        """The output_4 one-sided records that ``{side, key}`` references name."""
        return [self.one_sided[(r["side"], r["key"])] for r in refs]


# Keys the triage reads from each record (output_schemas.md of the sibling skill).
_MODULE_KEYS = {"pid", "kind", "train_modules", "rollout_modules", "layer", "block", "role", "train_order",
                "input_status", "input_status_source", "parameter_status", "output_status", "amplification",
                "dtype_boundary", "status", "module_priority_rank", "rank_reason", "is_container", "points", "note",
                "previous_aligned", "containers", "one_sided_between"}
_RESULT_KEYS = {"cid", "point", "status", "error", "train", "rollout", "dtype_differs", "pair"}
_ONE_SIDED_KEYS = {"side", "module", "key", "class", "index", "expected", "reason", "activation_like",
                   "pass_through", "points"}


def _check(path: Path, records, keys: set, what: str) -> None:
    if not isinstance(records, list):
        raise EvidenceError(f"{path}: '{what}' is not a list")
    for i, rec in enumerate(records):
        missing = keys - set(rec) if isinstance(rec, dict) else keys
        if missing:
            raise EvidenceError(f"{path}: {what}[{i}] lacks {', '.join(sorted(missing))}")


def load(out_dir: Path) -> Evidence:
    """Load output_1 (sources only), output_2, output_3 and output_4 from ``out_dir``; malformed
    records are an EvidenceError."""
    paths = [out_dir / n for n in ("output_2_mapping.json", "output_3_value_compare.json",
                                   "output_4_module_analysis.json")]
    ev = Evidence(*(_read(p) for p in paths))
    _check(paths[1], ev.compare.get("results"), _RESULT_KEYS, "results")
    _check(paths[2], ev.analysis.get("modules"), _MODULE_KEYS, "modules")
    _check(paths[2], ev.analysis.get("one_sided"), _ONE_SIDED_KEYS, "one_sided")
    for i, m in enumerate(ev.analysis["modules"]):
        if not isinstance(m["points"], dict) or not {"in", "param", "out"} <= set(m["points"]):
            raise EvidenceError(f"{paths[2]}: modules[{i}].points needs in, param and out lists")
    doc1 = _read(out_dir / "output_1_key_mapping.json")
    ev.sources = doc1.get("sources") or {}
    ev.key_rows = {s: doc1.get(s) if isinstance(doc1.get(s), list) else [] for s in ("train", "rollout")}
    ev.modules = ev.analysis.get("modules", [])
    ev.pos = {m["pid"]: i for i, m in enumerate(ev.modules)}
    ev.results = {r["cid"]: r for r in ev.compare.get("results", [])}
    ev.one_sided = {(o["side"], o["key"]): o for o in ev.analysis["one_sided"]}
    ev.vocab = _vocabulary(paths[2], ev.analysis)
    _check_references(paths[2], ev)
    return ev


def _check_references(path: Path, ev: Evidence) -> None:
    """Every pair id and one-sided key a verdict names is a record of the same file."""
    for i, m in enumerate(ev.modules):
        observed = list((m.get("observed_downstream") or {}).values())
        refs = [*m["one_sided_between"], *(r for obs in observed for r in obs.get("one_sided_between", []))]
        pids = [m["previous_aligned"], *m["containers"]]
        bad = [p for p in pids if p is not None and p not in ev.pos]
        bad += [f"observed_downstream without one_sided_between ({obs.get('module')})"
                for obs in observed if "one_sided_between" not in obs]
        bad += [json.dumps(r) for r in refs
                if not isinstance(r, dict) or (r.get("side"), r.get("key")) not in ev.one_sided]
        if bad:
            raise EvidenceError(f"{path}: modules[{i}] has references that do not resolve in this file: {', '.join(map(str, bad))}")
