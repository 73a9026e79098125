"""The token ids a side ran, recovered from its dump, for the reference forward (issue 17).

Sources, most certain first: ids the user gives (``--token-ids``), the ids tensor where it was
dumped (tensor mode), then statistics. msprobe's statistics of the ids tensor give its count, Max
and Min, so a call holding one token (a decode step) names its id exactly. A call holding one
token whose ids were not dumped is matched on its embedding output: each checkpoint row, rounded
to the side's dtype, has its own Max/Min/Mean/Norm, and the row whose four statistics equal the
dumped ones is the token. A call holding several tokens (a prefill) cannot be recovered from
statistics: four numbers over the whole call neither name every token nor give their order, so
the ids stay unknown and the reason is reported instead of a guess.
Why: references/reference_forward_evidence.md.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .arrays import leaf_array, to_dtype
from .callruns import side_leaves
from .compare.logprob import TOKENS_POINT
from .compare.tensors import as_tokens
from .dtypes import dtype_key, is_int_dtype
from .errors import InputError

# Max and Min of an embedding output are copies of checkpoint values: equal up to the float
# printing of the dump (msprobe writes them as Python floats).
_EXACT_REL = 1e-6


@dataclass
class TokenIds:
    """One side's token ids, how they were found, and whether each call's match was unique."""
    ids: list[int] | None
    how: str                      # given | tensor | statistics | mixed | none
    unique: bool
    detail: str
    calls: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        """The output_3/output_4 ``reference_forward.tokens`` entry of this side."""
        return {"ids": self.ids, "how": self.how, "unique": self.unique, "detail": self.detail,
                "calls": self.calls}


def parse_given(text: str | None) -> list[int] | None:
    """``--token-ids``: the whole sequence (prompt + response) as users hold it, or None without
    the option. Accepted: a JSON list of ints; a file holding one; a file holding
    ``{"prompt_ids": [...], "response_ids": [...]}`` (what ``dump_vllm.py`` writes as
    tokens.json); a log-prob JSONL of one sequence (``prompt_ids`` + ``token_ids``)."""
    if text is None:
        return None
    src = text
    if not text.lstrip().startswith("["):
        p = Path(text)
        if not p.is_file():
            raise InputError(f"{text}: --token-ids takes a JSON list of integers such as [1, 2, 3] or a file "
                             f"holding one, and no file of that name exists")
        try:
            src = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{text}: --token-ids file cannot be read ({exc.__class__.__name__})") from None
    try:
        ids = _sequence(src)
    except (json.JSONDecodeError, RecursionError):
        raise InputError(f"{text}: --token-ids is not a JSON list of integers such as [1, 2, 3], nor a "
                         f"file holding one or {{\"prompt_ids\": [...], \"response_ids\": [...]}}") from None
    except ValueError as exc:
        raise InputError(f"{text}: --token-ids {exc}") from None
    if not _id_list(ids):
        raise InputError(f"{text}: --token-ids must be a non-empty JSON list of non-negative integers")
    return ids


def _id_list(x) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                   for i in x)


def _sequence(src: str):
    """The ids of one sequence from the text of a list, a tokens.json object or a one-record JSONL."""
    lines = [ln for ln in src.splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].lstrip().startswith("{"):
        raise ValueError(f"holds {len(lines)} records (a log-prob JSONL of several sequences): "
                         f"give the ids of the one sequence the dumps ran")
    doc = json.loads(src)
    if not isinstance(doc, dict):
        return doc
    response = doc.get("response_ids", doc.get("token_ids"))
    prompt = doc.get("prompt_ids")
    if prompt is None or response is None:
        raise ValueError("object needs both \"prompt_ids\" and \"response_ids\" (or \"token_ids\") lists")
    if not (_id_list(prompt) and isinstance(response, list) and (not response or _id_list(response))):
        raise ValueError("\"prompt_ids\" and \"response_ids\" must be lists of non-negative integers")
    return prompt + response


def _calls(leaf) -> list[tuple[float | None, float | None, float | None, float | None]]:
    """(Max, Min, Mean, Norm) of each call a leaf holds (folded calls have one row each)."""
    if leaf.per_call is not None and len(leaf.per_call) > 1:
        return [tuple(None if math.isnan(v) else float(v) for v in row) for row in leaf.per_call]
    return [(leaf.max, leaf.min, leaf.mean, leaf.norm)]


class RowIndex:
    """Max/Min/Mean/Norm of every embedding row in one dtype, for matching one-token calls."""

    def __init__(self, embedding: np.ndarray, dtype: str):
        rows = to_dtype(embedding, dtype).astype(np.float64)
        self.max, self.min = rows.max(axis=1), rows.min(axis=1)
        self.mean, self.norm = rows.mean(axis=1), np.sqrt((rows * rows).sum(axis=1))
        self.width = rows.shape[1]

    def match(self, stats: tuple, tol: float) -> list[int]:
        """Rows whose Max and Min equal the call's and whose Mean and Norm are within ``tol``."""
        mx, mn, mean, norm = stats
        if mx is None or mn is None:
            return []
        scale = max(abs(mx), abs(mn), 1e-30)
        ok = (np.abs(self.max - mx) <= _EXACT_REL * scale) & (np.abs(self.min - mn) <= _EXACT_REL * scale)
        if mean is not None:
            ok &= np.abs(self.mean - mean) <= tol * scale
        if norm is not None:
            ok &= np.abs(self.norm - norm) <= tol * max(abs(norm), 1e-30)
        return [int(i) for i in np.flatnonzero(ok)]


def recover(carriers: dict, view, embedding: np.ndarray | None, given: list[int] | None, use_tensors: bool,
            tolerance: float) -> TokenIds:
    """Token ids of one side from its ``tokens`` and embedding-output carriers.

    ``carriers``: {"tokens": [Leaf], "embed": [Leaf]} in call order (a stitched side lists one
    leaf per step). ``embedding``: the checkpoint's embedding matrix (None without one).
    """
    tok, emb = carriers.get("tokens") or [], carriers.get("embed") or []
    total = sum((lf.numel or 0) * (len(lf.per_call) if lf.per_call is not None else 1) for lf in tok) or None
    if given is not None and (total is None or len(given) >= total):
        return _check_given(given, tok)
    calls: list[dict] = []
    width = embedding.shape[1] if embedding is not None else None
    rows = None
    tok_calls = [(lf, s) for lf in tok for s in _calls(lf)]
    emb_calls = [(lf, s) for lf in emb for s in _calls(lf)]
    n = max(len(tok_calls), len(emb_calls))
    for i in range(n):
        tleaf, tstats = tok_calls[i] if i < len(tok_calls) else (None, None)
        eleaf, estats = emb_calls[i] if i < len(emb_calls) else (None, None)
        count = _count(tleaf, eleaf, width)
        # One call per leaf only: a folded leaf's tensor file is call 0's.
        whole = use_tensors and tleaf is not None and tleaf.per_call is None and tleaf.data_name
        arr = leaf_array(view, tleaf) if whole else None
        if arr is not None:
            ids = [int(x) for x in as_tokens(arr, view.family).reshape(-1)]
            calls.append({"tokens": len(ids), "ids": ids, "how": "tensor", "unique": True})
            continue
        if count == 1 and tstats is not None and tstats[0] is not None and tstats[0] == tstats[1]:
            calls.append({"tokens": 1, "ids": [int(tstats[0])], "how": "input_ids statistics", "unique": True})
            continue
        if count == 1 and estats is not None and embedding is not None:
            if rows is None:
                rows = RowIndex(embedding, dtype_key(eleaf.dtype))
            hits = rows.match(estats, tolerance)
            calls.append({"tokens": 1, "ids": hits[:1] if len(hits) == 1 else None, "candidates": hits[:8],
                          "how": "embedding row statistics", "unique": len(hits) == 1})
            continue
        known = _known_ids(tstats)
        calls.append({"tokens": count, "ids": None, "how": "statistics", "unique": False, "known": known,
                      "reason": (f"one call holds {count} tokens: Max/Min/Mean/Norm of the call name at most a few "
                                 "of them and never their order" if count else "the call's token count is unknown")})
    unused = None
    if given is not None:
        calls, unused = _fill(calls, given)
    ok = bool(calls) and all(c["unique"] for c in calls)
    ids = [i for c in calls for i in c["ids"]] if ok else None
    hows = sorted({c["how"] for c in calls})
    how = "none" if not calls else hows[0] if len(hows) == 1 else "mixed"
    if not calls:
        detail = "no tokens or embedding output in the dump"
    elif ok:
        detail = f"{len(ids)} token(s) from {', '.join(hows)}"
    else:
        bad = next(c for c in calls if not c["unique"])
        detail = bad.get("reason") or (f"call {calls.index(bad)}: {len(bad.get('candidates') or [])} embedding rows "
                                       "match its statistics")
        if given is None:
            detail += "; give the ids with --token-ids"
    if unused:
        detail = f"{unused}; {detail}"
    return TokenIds(ids, how, ok, detail, calls)


def _fill(calls: list[dict], given: list[int]) -> tuple[list[dict], str | None]:
    """Fewer ids given than the side ran (the prompt, say): they fill, in order, the calls the dump
    could not name (a prefill), checked against the ids each such call recorded (Max, Min).
    Returns the calls and, when the ids do not fill those calls exactly, why they were not used."""
    out, pos = [], 0
    for c in calls:
        n = c.get("tokens") or 0
        part = given[pos:pos + n]
        if c["unique"] or not n or len(part) < n:
            out.append(c)
            continue
        pos += n
        known = c.get("known") or []
        fits = not known or (min(part) == known[0] and max(part) == known[-1])
        out.append({**c, "ids": part if fits else None, "how": "given", "unique": fits,
                    "reason": None if fits else f"--token-ids {part} disagree with the call's ids (Min/Max {known})"})
    if pos != len(given):
        need = sum(c.get("tokens") or 0 for c in calls if not c["unique"])
        return calls, (f"--token-ids holds {len(given)} ids, the calls the dump cannot name hold {need} tokens "
                       f"(of {sum(c.get('tokens') or 0 for c in calls)} in all): not used")
    return out, None


def _count(tleaf, eleaf, width: int | None) -> int | None:
    if tleaf is not None and tleaf.numel is not None:
        return tleaf.numel
    if eleaf is not None and eleaf.numel is not None and width:
        return eleaf.numel // width
    return None


def _known_ids(stats) -> list[int]:
    if stats is None or stats[0] is None or stats[1] is None:
        return []
    return sorted({int(stats[0]), int(stats[1])})


def _check_given(given: list[int], tok: list) -> TokenIds:
    """The user's ids, checked against the count, Max and Min the dump recorded for its ids.

    A side that ran fewer tokens than given ran their prefix: an engine's forward calls cover the
    prompt and every sampled token but the last (it is returned, never fed back), and a dump that
    stops early covers less. The prefix is taken only when every call's Max and Min hold it."""
    counts = [(lf.numel, s) for lf in tok for s in _calls(lf)]
    numel = sum(n for n, _s in counts if n is not None) if tok else None
    if numel is not None and numel > len(given):
        return TokenIds(None, "given", False, f"--token-ids holds {len(given)} ids, the dump's ids tensor {numel}")
    ids = list(given) if numel is None else list(given[:numel])
    pos, calls = 0, []
    for n, s in counts:
        part = ids[pos:pos + (n or 0)]
        pos += n or 0
        if part and s[0] is not None and (max(part) != s[0] or min(part) != s[1]):
            return TokenIds(None, "given", False,
                            f"--token-ids disagree with the dump's ids statistics (Max {s[0]:g}, Min {s[1]:g} "
                            f"vs {max(part)}, {min(part)})")
        calls.append({"tokens": len(part), "ids": part, "how": "given", "unique": True})
    if len(calls) < 2 or any(c["tokens"] == 0 for c in calls):
        calls = [{"tokens": len(ids), "ids": ids, "how": "given", "unique": True}]
    checked = " (count, Max and Min agree with the dump)" if counts else ""
    if len(ids) < len(given):
        dropped = len(given) - len(ids)
        why = ("the last sampled token, which the engine returns and never feeds back" if dropped == 1
               else "tokens this side's dump does not reach")
        detail = (f"the first {len(ids)} of the {len(given)} ids given with --token-ids, in {len(calls)} call(s) "
                  f"({dropped} left out: {why}){checked}")
    else:
        detail = f"{len(given)} token(s) given with --token-ids in {len(calls)} call(s){checked}"
    return TokenIds(ids, "given", True, detail, calls)


def side_carriers(plans, side: str, recs: list, leaves: list[dict]) -> dict:
    """The tokens and embedding-output leaves of ``side``, in call order (``leaves``: per record,
    leaf name -> Leaf, as in the side's view)."""
    def pick(point: str, role: str | None) -> list:
        plan = next((p for p in plans if p.point == point and p.pair is None
                     and (role is None or all(recs[c.rec].role == role for c in getattr(p, side)))), None)
        return side_leaves(leaves, getattr(plan, side), plan.stitched == side) if plan else []
    return {"tokens": [lf for lf in pick(TOKENS_POINT, None) if lf is not None and is_int_dtype(lf.dtype)],
            "embed": [lf for lf in pick("L0.resid_in", "embed") if lf is not None]}
