"""Read one side's per-token log-probs from the files users hold, each format detected by content.

Every reader returns a :class:`LogprobSide`: the sequences laid end to end (flat arrays and offsets,
so that a million tokens cost little more than parsing them) with their ids, response token ids,
the log-prob of each sampled token and, where the file gives them, the top-k per position.
``references/logprob_inputs.md`` documents each format; anything else is a :class:`LogprobInputError`
whose message is one line naming the file.
"""
from __future__ import annotations

import itertools
import json
import math
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_ZIP = b"PK\x03\x04"
_PARQUET = b"PAR1"
_NPY = b"\x93NUMPY"
# Log-prob keys of RL batches (verl DataProto names, singular forms as verl's rollout-correction
# arguments spell them, then generic names): each side takes its own.
TRAIN_KEYS = ("old_log_probs", "old_log_prob", "log_probs", "logprobs")
ROLLOUT_KEYS = ("rollout_log_probs", "rollout_log_prob", "log_probs", "logprobs")
_OTHER_SIDE = {"train": ROLLOUT_KEYS[:2], "rollout": TRAIN_KEYS[:2]}
_TOKEN_ID_STRING = re.compile(r"token_id:(-?\d+)")


class LogprobInputError(Exception):
    """A log-prob file that cannot be read (one line naming the file; exit code 2)."""


@dataclass(frozen=True)
class LogprobSide:
    """One side's log-probs over its sequences, laid end to end.

    Sequence ``s`` owns entries ``offsets[s]:offsets[s+1]`` of ``token_ids``/``logprobs`` (and of the
    top-k arrays, padded with id -1 and log-prob -inf past what a position gave)."""

    path: str
    format: str
    ids: tuple[str, ...]
    ids_given: bool                   # False: the file has no sequence ids (pair by order)
    offsets: np.ndarray               # [S+1] int64
    token_ids: np.ndarray             # [N] int64
    logprobs: np.ndarray              # [N] float64
    top_ids: np.ndarray | None = None     # [N, k] int64, sorted by log-prob, best first
    top_logprobs: np.ndarray | None = None
    ranks: np.ndarray | None = None       # [N] rank of the sampled token (1 = best) where the file gives it
    prompt_ids: tuple | None = None       # per sequence: tuple of ints, or None
    meta: dict = field(default_factory=dict)   # dtype, temperature, logprobs_mode when the file says
    notes: tuple[str, ...] = ()

    @property
    def sequences(self) -> int:
        return len(self.ids)

    @property
    def tokens(self) -> int:
        return int(self.token_ids.size)


def _fail(path, problem: str):
    raise LogprobInputError(f"{path}: {' '.join(str(problem).split())[:300]}")


# ------------------------------------------------------------------------------------------------
# building a side from per-sequence lists


def _top_arrays(tops: list, n: int, path) -> tuple[np.ndarray, np.ndarray] | None:
    """Top-k lists (per position a list of (id, logprob)) as padded arrays sorted best first."""
    if not any(tops):
        return None
    k = max(len(t) for t in tops)
    ids = np.full((n, k), -1, np.int64)
    lps = np.full((n, k), -np.inf)
    for i, pos in enumerate(tops):
        if pos:
            pos = sorted(pos, key=lambda e: -e[1] if e[1] == e[1] else math.inf)
            ids[i, :len(pos)] = [e[0] for e in pos]
            lps[i, :len(pos)] = [e[1] for e in pos]
    return ids, lps


def _number(v) -> float:
    if v is None:
        return math.nan
    if isinstance(v, str):          # our own JSON writes non-finite values as strings
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(v, math.nan)
    return float(v)


def _build(path, fmt: str, seqs: list[tuple], *, ids_given: bool, meta: dict, notes=(),
           ranks: list | None = None) -> LogprobSide:
    """``seqs``: (id, token_ids, logprobs, top or None, prompt_ids or None) per sequence."""
    if not seqs:
        _fail(path, f"{fmt}: no sequences in the file")
    lengths = np.fromiter((len(s[1]) for s in seqs), np.int64, len(seqs))
    for s in seqs:
        if len(s[1]) != len(s[2]):
            _fail(path, f"sequence {s[0]!r}: {len(s[1])} token ids but {len(s[2])} log-probs")
    offsets = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    n = int(offsets[-1])
    try:
        tok = np.fromiter(itertools.chain.from_iterable(s[1] for s in seqs), np.int64, n)
        lp = np.fromiter(itertools.chain.from_iterable(s[2] for s in seqs), np.float64, n)
    except (TypeError, ValueError):
        lp = np.array([_number(v) for s in seqs for v in s[2]], np.float64)
        try:
            tok = np.array([int(v) for s in seqs for v in s[1]], np.int64)
        except (TypeError, ValueError):
            _fail(path, f"{fmt}: a token id is not an integer")
    top = None
    if any(s[3] for s in seqs):
        flat = [p for s in seqs for p in (s[3] or [None] * len(s[1]))]
        if len(flat) != n:
            _fail(path, f"{fmt}: top-k lists do not have one entry per response token")
        top = _top_arrays(flat, n, path)
    ids = tuple(str(s[0]) for s in seqs)
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        _fail(path, f"sequence id {dup!r} appears more than once")
    prompts = tuple(tuple(s[4]) if s[4] is not None else None for s in seqs)
    rank_arr = None
    if ranks is not None:
        rank_arr = np.array([np.nan if r is None else r for r in ranks], np.float64)
    return LogprobSide(path=str(path), format=fmt, ids=ids, ids_given=ids_given, offsets=offsets, token_ids=tok,
                       logprobs=lp, top_ids=None if top is None else top[0],
                       top_logprobs=None if top is None else top[1], ranks=rank_arr,
                       prompt_ids=prompts if any(p is not None for p in prompts) else None,
                       meta=meta, notes=tuple(notes))


def one_sequence(path: str, fmt: str, sid: str, token_ids, logprobs, prompt_ids, meta: dict) -> LogprobSide:
    """One sequence's log-probs as a side (the dumped logits' per-token list of output_3 is one
    sequence per side), so that the triage judges it like a file."""
    return _build(path, fmt, [(sid, list(token_ids), list(logprobs), None, prompt_ids)], ids_given=True, meta=meta)


def _meta_of(records: list[dict]) -> dict:
    """dtype / temperature / logprobs_mode as the records state them (first record that does)."""
    out = {}
    for key in ("dtype", "temperature", "logprobs_mode"):
        vals = {json.dumps(r[key]) for r in records if isinstance(r, dict) and r.get(key) is not None}
        if len(vals) == 1:
            out[key] = json.loads(vals.pop())
        elif len(vals) > 1:
            out[key] = "mixed"
    return out


# ------------------------------------------------------------------------------------------------
# JSON formats


def _generic(path, records: list[dict]) -> LogprobSide:
    seqs = []
    for i, r in enumerate(records):
        tops = r.get("top_logprobs")
        top = None
        if tops is not None:
            try:
                top = [[(int(e["token_id"]), _number(e["logprob"])) for e in (pos or [])] for pos in tops]
            except (TypeError, KeyError, ValueError):
                _fail(path, f"record {i}: top_logprobs must be lists of {{token_id, logprob}}")
        seqs.append((r.get("id", i), r["token_ids"], r["logprobs"], top, r.get("prompt_ids")))
    return _build(path, "generic_jsonl", seqs, ids_given=all("id" in r for r in records), meta=_meta_of(records))


def _rows(path, doc: dict) -> LogprobSide:
    """A list of variable-length rows: {"token_ids": [[...], ...], "logprobs": [[...], ...]}."""
    toks, lps = doc["token_ids"], doc["logprobs"]
    if len(toks) != len(lps):
        _fail(path, f"{len(toks)} token-id rows but {len(lps)} log-prob rows")
    ids = doc.get("ids") or list(range(len(toks)))
    prompts = doc.get("prompt_ids") or [None] * len(toks)
    seqs = [(ids[i], toks[i], lps[i], None, prompts[i]) for i in range(len(toks))]
    return _build(path, "rows", seqs, ids_given="ids" in doc, meta=_meta_of([doc]))


def _vllm(path, records: list[dict]) -> LogprobSide:
    """The snippet of references/logprob_inputs.md: one RequestOutput per record."""
    seqs, ranks = [], []
    for i, rec in enumerate(records):
        outs = rec.get("outputs") or []
        for out in outs:
            positions = out.get("logprobs")
            toks = out.get("token_ids")
            if not isinstance(positions, list) or not isinstance(toks, list) or len(positions) != len(toks):
                _fail(path, f"request {i}: outputs[].logprobs must hold one dict per token id (logprobs=k set?)")
            lps, top = [], []
            for tok, pos in zip(toks, positions):
                entry = pos.get(str(tok)) if isinstance(pos, dict) else None
                if entry is None:
                    _fail(path, f"request {rec.get('request_id', i)}: sampled token {tok} missing from its logprobs")
                lps.append(_number(entry.get("logprob")))
                ranks.append(entry.get("rank"))
                top.append([(int(t), _number(e.get("logprob"))) for t, e in pos.items()
                            if t != str(tok) or (e.get("rank") or 10**9) <= len(pos)])
            sid = rec.get("request_id", i) if len(outs) == 1 else f"{rec.get('request_id', i)}:{out.get('index', 0)}"
            seqs.append((sid, toks, lps, top, rec.get("prompt_token_ids")))
    meta = _meta_of(records)
    meta.setdefault("logprobs_mode", "raw_logprobs")
    return _build(path, "vllm", seqs, ids_given=all("request_id" in r for r in records), meta=meta,
                  notes=("vLLM returns raw_logprobs unless the engine was started with logprobs_mode=processed_"
                         "logprobs: log-probs before temperature, penalties and top-k/top-p",)
                  if meta["logprobs_mode"] == "raw_logprobs" else (), ranks=ranks)


def _sglang(path, records: list[dict]) -> LogprobSide:
    """SGLang native /generate responses (return_logprob=True): meta_info.output_token_logprobs holds
    [logprob, token_id, text] per generated token, output_top_logprobs the top-k lists."""
    seqs = []
    for i, rec in enumerate(records):
        meta = rec["meta_info"]
        entries = meta.get("output_token_logprobs")
        if not isinstance(entries, list):
            _fail(path, f"response {i}: meta_info has no output_token_logprobs (send return_logprob=true)")
        try:
            toks = [int(e[1]) for e in entries]
            lps = [_number(e[0]) for e in entries]
        except (TypeError, IndexError, ValueError):
            _fail(path, f"response {i}: output_token_logprobs entries must be [logprob, token_id, text]")
        top = None
        if isinstance(meta.get("output_top_logprobs"), list):
            top = [[(int(e[1]), _number(e[0])) for e in (pos or [])] for pos in meta["output_top_logprobs"]]
        prompt = None
        if isinstance(meta.get("input_token_logprobs"), list):
            prompt = [int(e[1]) for e in meta["input_token_logprobs"]]
        seqs.append((meta.get("id", i), toks, lps, top, prompt))
    return _build(path, "sglang", seqs, ids_given=all("id" in r["meta_info"] for r in records), meta={})


def _openai_token_id(tok, path, where: str) -> int:
    m = _TOKEN_ID_STRING.fullmatch(str(tok))
    if m is None:
        _fail(path, f"{where}: logprobs carry token strings, not token ids ({str(tok)[:20]!r}); strings cannot be "
                    "paired with the trainer's ids: ask vLLM's server with return_tokens_as_token_ids=true")
    return int(m.group(1))


def _openai(path, records: list[dict]) -> LogprobSide:
    """OpenAI-compatible completion or chat responses whose logprobs carry token ids."""
    seqs = []
    for i, rec in enumerate(records):
        for ch in rec.get("choices") or []:
            lp = ch.get("logprobs")
            where = f"response {rec.get('id', i)} choice {ch.get('index', 0)}"
            if not isinstance(lp, dict):
                _fail(path, f"{where}: no logprobs (request logprobs)")
            if isinstance(lp.get("content"), list):            # chat
                items = lp["content"]
                toks = [_openai_token_id(e.get("token"), path, where) for e in items]
                lps = [_number(e.get("logprob")) for e in items]
                top = [[(_openai_token_id(t.get("token"), path, where), _number(t.get("logprob")))
                        for t in (e.get("top_logprobs") or [])] for e in items]
            elif isinstance(lp.get("token_logprobs"), list):   # completion
                toks = [_openai_token_id(t, path, where) for t in lp.get("tokens") or []]
                lps = [_number(v) for v in lp["token_logprobs"]]
                top = [[(_openai_token_id(t, path, where), _number(v)) for t, v in (d or {}).items()]
                       for d in (lp.get("top_logprobs") or [])] or None
            else:
                _fail(path, f"{where}: logprobs has neither content (chat) nor token_logprobs (completion)")
            if isinstance(ch.get("token_ids"), list) and len(ch["token_ids"]) == len(toks):
                toks = [int(t) for t in ch["token_ids"]]
            seqs.append((f"{rec.get('id', i)}:{ch.get('index', 0)}", toks, lps, top or None,
                         ch.get("prompt_token_ids") or rec.get("prompt_token_ids")))
    return _build(path, "openai", seqs, ids_given=all("id" in r for r in records), meta={})


def _classify(path, records: list) -> LogprobSide:
    first = records[0] if records else None
    if not all(isinstance(r, dict) for r in records) or first is None:
        _fail(path, "JSON holds no log-prob records (expected objects, one per sequence)")
    if "meta_info" in first:
        return _sglang(path, records)
    if "choices" in first:
        return _openai(path, records)
    if "outputs" in first:
        return _vllm(path, records)
    if "token_ids" in first and "logprobs" in first:
        if len(records) == 1 and first["token_ids"] and isinstance(first["token_ids"][0], list):
            return _rows(path, first)
        return _generic(path, records)
    keys = ", ".join(sorted(map(str, first))[:8])
    _fail(path, f"unrecognised log-prob records (keys: {keys}); see references/logprob_inputs.md for the formats")


def _json_records(path: Path, text: str) -> list:
    head = text.lstrip()[:1]
    if head not in ("{", "["):
        _fail(path, "neither JSON/JSONL, .npz, .pt nor parquet")
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, list) else [doc]
    except RecursionError:
        _fail(path, "JSON nested too deeply")
    except ValueError:
        pass
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                _fail(path, f"line {n}: not JSON ({exc.msg})")
    return records


# ------------------------------------------------------------------------------------------------
# array formats (RL batches)


def _batch(path, fmt: str, arrays: dict, side: str) -> LogprobSide:
    keys = TRAIN_KEYS if side == "train" else ROLLOUT_KEYS
    key = next((k for k in keys if k in arrays), None)
    if key is None:
        other = [k for k in _OTHER_SIDE[side] if k in arrays]
        hint = f"; it holds {other[0]}, the other side's log-probs" if other else ""
        _fail(path, f"no {side} log-probs ({' or '.join(keys[:2])}) among the keys {sorted(arrays)[:10]}{hint}")
    lp = arrays[key]
    if "responses" not in arrays:
        _fail(path, "no 'responses' (response token ids [B, T]): the two sides cannot be paired without them")
    if isinstance(lp, list):       # variable-length rows
        toks = arrays["responses"]
        seqs = [(i, np.asarray(toks[i]).reshape(-1).tolist(), np.asarray(lp[i], np.float64).reshape(-1).tolist(),
                 None, None) for i in range(len(lp))]
        return _build(path, fmt, seqs, ids_given=False, meta={})
    # Kept in the file's dtype until the mask has picked the response tokens: one float64 copy of
    # those only, not of the padded batch.
    lp = np.asarray(lp)
    if lp.dtype.kind != "f":
        lp = lp.astype(np.float64)
    toks = np.asarray(arrays["responses"])
    if lp.ndim != 2 or toks.shape != lp.shape:
        _fail(path, f"{key} {lp.shape} and responses {toks.shape} must both be [B, T]")
    if "response_mask" in arrays:
        mask = np.asarray(arrays["response_mask"]) != 0
    elif "attention_mask" in arrays and np.asarray(arrays["attention_mask"]).shape[1] >= lp.shape[1]:
        mask = np.asarray(arrays["attention_mask"])[:, -lp.shape[1]:] != 0
    else:
        _fail(path, "no response_mask (or attention_mask) to say which positions are response tokens")
    if mask.shape != lp.shape:
        _fail(path, f"response_mask {mask.shape} does not match {key} {lp.shape}")
    lengths = mask.sum(axis=1)
    offsets = np.zeros(lp.shape[0] + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    prompts = None
    if "prompts" in arrays:
        pr = np.asarray(arrays["prompts"])
        am = np.asarray(arrays["attention_mask"])[:, :pr.shape[1]] != 0 if "attention_mask" in arrays else None
        prompts = tuple(tuple(int(x) for x in (pr[b][am[b]] if am is not None else pr[b])) for b in range(pr.shape[0]))
    return LogprobSide(path=str(path), format=fmt, ids=tuple(str(i) for i in range(lp.shape[0])), ids_given=False,
                       offsets=offsets, token_ids=toks[mask].astype(np.int64, copy=False),
                       logprobs=lp[mask].astype(np.float64, copy=False),
                       prompt_ids=prompts, meta={}, notes=(f"log-probs from '{key}'",))


def _npz(path: Path, side: str) -> LogprobSide:
    try:
        with np.load(path, allow_pickle=False) as z:
            # The archive itself, not a dict of every array: an RL batch holds many more keys
            # (input_ids, position_ids, values, ...) than the few this side reads.
            return _batch(path, "rl_batch_npz", z, side)
    except ValueError as exc:       # the arrays are read inside _batch: a pickle refusal, or bad shapes
        _fail(path, f".npz with object arrays cannot be read without pickle ({exc})" if "pickle" in str(exc)
              else f"malformed RL batch ({exc})")
    except (OSError, EOFError) as exc:
        _fail(path, f"cannot read .npz ({exc})")


def _pt(path: Path, side: str, tensor_reader) -> LogprobSide:
    tensorio = tensor_reader() if tensor_reader else None
    if tensorio is None:
        _fail(path, "a torch .pt file, but the safe reader of the sibling compare skill is missing")
    try:
        arrays = tensorio.load_pt_dict(path)
    except tensorio.TensorReadError as exc:
        raise LogprobInputError(str(exc)) from None
    return _batch(path, "rl_batch_pt", arrays, side)


def _parquet(path: Path) -> LogprobSide:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        _fail(path, "a parquet file: install pyarrow to read it, or write the generic JSONL "
                    "(references/logprob_inputs.md)")
    table = pq.read_table(path)
    if not {"token_ids", "logprobs"} <= set(table.column_names):
        _fail(path, f"parquet columns {table.column_names[:8]} lack token_ids and logprobs")
    return _generic(path, table.to_pylist())


def read(path, side: str, tensor_reader=None) -> LogprobSide:
    """One side's log-probs from ``path`` (``side`` is "train" or "rollout": it picks the RL-batch key).

    ``tensor_reader()`` returns the sibling compare skill's safe tensor reader module (or None); it is
    called only for a ``.pt`` file.
    Raises LogprobInputError with a one-line message naming the file.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(8)
        if magic.startswith(_ZIP):
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
            if any(n.endswith("/data.pkl") for n in names):
                return _pt(path, side, tensor_reader)
            return _npz(path, side)
        if magic.startswith(_PARQUET):
            return _parquet(path)
        if magic.startswith(_NPY):
            _fail(path, "a single .npy array; give a .npz/.pt dict with the RL batch keys or the generic JSONL")
        text = path.read_text(encoding="utf-8")
    except LogprobInputError:
        raise
    except UnicodeDecodeError:
        _fail(path, "not UTF-8 text and not .npz, .pt or parquet")
    except OSError as exc:
        _fail(path, f"cannot read ({exc.strerror or exc})")
    except Exception as exc:  # noqa: BLE001 - a corrupt zip may fail anywhere; one line for the user
        _fail(path, f"cannot read ({type(exc).__name__}: {exc})")
    try:
        return _classify(path, _json_records(path, text))
    except LogprobInputError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as exc:
        _fail(path, f"malformed log-prob records ({type(exc).__name__}: {exc})")
