"""Which side is wrong: the one owner of a finding's ``side`` and ``side_reason``.

It reads evidence records and decides: what the dumps alone show (``Structural``, made by the
triage's rules), the parameters held against the checkpoint, the configs each side resolved and
the replays (output_3 ``reference``, ``replays``), and the side the reference forward names (output_4
``reference_forward.verdict``, the compare skill's reading of each side's departure). It writes a finding's ``side``, ``side_reason``,
``side_evidence`` and ``config_keys``. The side values and how each is decided, and when it
cannot be: references/deciding_the_side.md.
"""
from __future__ import annotations

from dataclasses import dataclass

from .evidence import Evidence
from .hypotheses import config_keys

TRAIN, ROLLOUT = "train", "rollout"
SIDES = (TRAIN, ROLLOUT)
BOTH = "both"                  # each side's own copy departs from the reference
NEITHER = "neither"            # both sides reproduce the reference: the difference is precision
UNDETERMINED = "undetermined"  # the evidence cannot tell


@dataclass(frozen=True)
class Structural:
    """What the dumps alone say about a finding's side (made by the triage rule that fired).

    ``side`` is ``train`` or ``rollout`` where the data gives the side away (permuted fused rows,
    a lower-precision output, a one-sided op, a side's own row layout), None where it does not;
    ``reason`` says why in either case."""
    side: str | None
    reason: str


def from_structure(claim: Structural) -> dict:
    """The ``side`` and ``side_reason`` fields the dumps alone give a finding."""
    return {"side": claim.side or UNDETERMINED, "side_reason": claim.reason}


def carried() -> dict:
    """The side of an ``upstream_propagation`` finding: both sides carry the divergence that an
    earlier cause started, so neither copy is where it begins."""
    return {"side": BOTH}


def checkpoint_fits(ev: Evidence) -> bool:
    """False when the compare step found that the --model checkpoint matches neither side (output_4
    ``reference_fit.fits`` false: another model, or saved at another step); then no side is drawn
    from it (its parameters, config, replays against its config or forward). True otherwise, also
    when the fit is unknown (no parameter was held against it)."""
    return (ev.analysis.get("reference_fit") or {}).get("fits") is not False


# What the compare step's output_4 ``reference_fit.reason`` starts with when the checkpoint fits
# neither side; said here too when a reader finds no reason.
UNFIT = "this checkpoint matches neither side: another model, or saved at another step"


def unfit_reason(ev: Evidence) -> str:
    """What a finding's side reason says when the checkpoint fits neither side."""
    return ((ev.analysis.get("reference_fit") or {}).get("reason") or UNFIT) + \
        "; no side is drawn from it: rerun with --model set to the checkpoint both engines loaded"


def reference_section(ev: Evidence) -> dict | None:
    """output_5 ``reference``: which checkpoint each side was checked against and what it was taken to be."""
    ref = ev.compare.get("reference")
    if not ref:
        return None
    out = {}
    for side in SIDES:
        r = ref.get(side)
        if r:
            out[side] = {"folder": r.get("folder"), "files": r.get("files"), "taken_as": r.get("taken_as"),
                         "config_file": r.get("config_file")}
    out["meaning"] = ("initial: the checkpoint both engines loaded before the first weight sync, valid for dumps "
                      "taken before any update; at_step: a checkpoint saved at the dumped step. After a sync the "
                      "trainer is the rollout's weight source, so an initial checkpoint no longer describes either "
                      "side's updated weights")
    return out


def forward_section(ev: Evidence) -> dict | None:
    """output_5 ``reference_forward``: the compare step's reference forward without its per-point
    records (tokens and how they were found, each side's departure, the simulated hypotheses)."""
    return _forward(ev) or None


def _forward(ev: Evidence) -> dict:
    """output_4 ``reference_forward`` (the output_3 section without its per-point records)."""
    return ev.analysis.get("reference_forward") or {}


def forward_evidence(ev: Evidence, m: dict) -> dict | None:
    """The ``reference_forward`` side_evidence record of a finding at module ``m`` (None when the
    forward did not run). A side's departure at or before the finding's layer concerns it."""
    rf = _forward(ev)
    if not rf.get("ran"):
        return None
    rec = {"kind": "reference_forward", "verdict": rf.get("verdict"), "concerns_finding": False}
    for side in SIDES:
        sd = (rf.get("sides") or {}).get(side) or {}
        if not sd.get("ran"):
            rec[side] = {"ran": False, "reason": sd.get("reason")}
            continue
        dep = sd.get("departure")
        rec[side] = {"matching": sd.get("matching"), "points": sd.get("points"), "departure": dep}
        if dep and (dep.get("layer") is None or m.get("layer") is None or dep["layer"] <= m["layer"]):
            rec["concerns_finding"] = True
    hyp = [h for h in rf.get("hypotheses") or [] if h.get("side") in SIDES]
    rec["reproduced_by"] = {h["side"]: h.get("reproduced_by") for h in hyp}
    return rec


def side_from_forward(rec: dict | None) -> tuple[str | None, str | None]:
    """(side, reason) from a ``reference_forward`` record: the side the compare skill's verdict
    names (output_4 ``reference_forward.verdict``, its refforward.verdict), when it concerns the
    finding and names a side a finding can take (train, rollout, both); (None, None) otherwise:
    neither side departs, a side did not run, both depart at the same point, or the checkpoint
    fits neither side (the verdict is then withheld)."""
    if not rec or not rec.get("concerns_finding"):
        return None, None
    verdict = rec.get("verdict") or {}
    side = verdict.get("side")
    if side not in (TRAIN, ROLLOUT, BOTH):
        return None, None
    why = "reference forward: " + verdict.get("reason", "")
    repro = (rec.get("reproduced_by") or {}).get(side) or []
    if repro:
        why += f"; simulated in the reference, {repro[0]} reproduces the {side} side"
    return side, why


def _param_results(ev: Evidence, m: dict) -> list[dict]:
    return [ev.results[p["cid"]] for p in m["points"]["param"] if p.get("cid") in ev.results]


def unpaired_parameters(ev: Evidence, m: dict, side: str) -> list[dict]:
    """The reference checks of ``m``'s parameters that only ``side`` dumps (output_3
    ``reference.<side>.unpaired_parameters``: vLLM 0.32 shows no expert weight, transformers does)."""
    own = {p["point"] for p in m["points"]["param"] if p.get("cid") not in ev.results}
    recs = ((ev.compare.get("reference") or {}).get(side) or {}).get("unpaired_parameters") or []
    return [r for r in recs if r["point"] in own and r.get("module") in m[f"{side}_modules"]]


def parameter_evidence(ev: Evidence, m: dict) -> list[dict]:
    """One ``reference_parameters`` record per parameter of ``m`` that the reference judged (a
    parameter one side alone dumps has that side's record only)."""
    keys = ("matches_reference", "how", "exact", "layout", "detail", "checkpoint_tensors")
    out = []
    for r in _param_results(ev, m):
        ref = r.get("reference") or {}
        if not ref:
            continue
        rec = {"kind": "reference_parameters", "point": r["point"]}
        for side in SIDES:
            s = ref.get(side)
            if s:
                rec[side] = {k: s.get(k) for k in keys}
        out.append(rec)
    for side in SIDES:
        out += [{"kind": "reference_parameters", "point": u["point"], side: {k: u.get(k) for k in keys}}
                for u in unpaired_parameters(ev, m, side)]
    return out


def side_from_parameters(records: list[dict]) -> tuple[str | None, str | None]:
    """(side, reason) from reference_parameters records; (None, None) when they do not decide."""
    wrong = {s for rec in records for s in SIDES if (rec.get(s) or {}).get("matches_reference") is False}
    right = {s for s in SIDES if records and all((rec.get(s) or {}).get("matches_reference") is True
                                                   for rec in records)}
    if wrong == set(SIDES):
        return BOTH, "both sides' parameters differ from the reference checkpoint"
    if len(wrong) == 1:
        bad = wrong.pop()
        other = ROLLOUT if bad == TRAIN else TRAIN
        if other in right:
            return bad, (f"the {bad} side's parameter differs from the reference checkpoint while the {other} "
                         f"side's equals it")
        return bad, f"the {bad} side's parameter differs from the reference checkpoint ({other} side not decided)"
    return None, None


def config_evidence(ev: Evidence, role: str | None) -> tuple[list[str], list[dict]]:
    """(config keys of the role present in the configs, config_value records for keys the sides disagree on)."""
    ref = ev.compare.get("reference") or {}
    cfgs = {s: (ref.get(s) or {}).get("config") or {} for s in SIDES}
    model = next(((ref.get(s) or {}).get("model_config") for s in SIDES if ref.get(s)), None) or {}
    wanted = [k for k in config_keys(role) if any(k in c for c in cfgs.values())]
    records = []
    for key in sorted({k for c in cfgs.values() for k in c}):
        t, r = cfgs["train"].get(key), cfgs["rollout"].get(key)
        if ref.get("train") and ref.get("rollout") and t != r:
            rec = {"kind": "config_value", "key": key, "train": t, "rollout": r, "checkpoint": model.get(key)}
            if key in model and (t == model[key]) != (r == model[key]):
                rec["differs_from_checkpoint"] = "train" if r == model[key] else "rollout"
            records.append(rec)
    return wanted, records


def _path(m: dict, side: str):
    names = m[f"{side}_modules"]
    return names[0] if len(names) == 1 else list(names)


def _modules(f: dict, side: str) -> list[str]:
    names = f.get(f"{side}_module")
    return [] if names is None else [names] if isinstance(names, str) else list(names)


def replay_evidence(ev: Evidence, f: dict) -> list[dict]:
    """``replay`` records of the finding's modules (and, for a container, the modules inside it)."""
    out = []
    for r in ev.compare.get("replays") or []:
        mods = _modules(f, r["side"])
        if not any(r["module"] == p or r["module"].startswith(p + ".") for p in mods):
            continue
        rec = {"kind": "replay", "side": r["side"], "module": r["module"], "op": r["op"]}
        rec.update({k: r.get(k) for k in ("key", "reference_value", "residual_at_reference", "reproduces_reference",
                                          "fitted", "tolerance", "indistinguishable") if r.get(k) is not None})
        out.append(rec)
    return out


def side_from_replays(records: list[dict], exact_module: bool) -> tuple[str | None, str | None]:
    """(side, reason) from replays with the reference config; (None, None) when they do not decide."""
    judged = [r for r in records if r.get("reproduces_reference") is not None]
    wrong = {r["side"] for r in judged if not r["reproduces_reference"]}
    seen = {r["side"] for r in judged}
    if wrong == set(SIDES):
        return BOTH, "neither side's output is reproduced by the reference config's math"
    if len(wrong) == 1:
        bad = wrong.pop()
        other = ROLLOUT if bad == TRAIN else TRAIN
        r = next(x for x in judged if x["side"] == bad and not x["reproduces_reference"])
        tail = ("the other side's is reproduced by the reference" if other in seen else
                f"the {other} side computes it inline, where it is not replayed")
        return bad, (f"replayed from its own inputs, the {bad} side's {r['module']} is reproduced by "
                     f"{r['key']}={r['fitted']['value']!r} (residual {r['fitted']['residual']:.2g}), not by the "
                     f"reference {r['key']}={r['reference_value']!r} (residual {r['residual_at_reference']:.2g}); "
                     + tail)
    if exact_module and seen == set(SIDES) and not wrong:
        return NEITHER, ("both sides' outputs are reproduced by the reference config's math: the difference "
                           "is within the data's precision")
    return None, None


def _disagreements(records: list[dict]) -> list[str]:
    """Without a reference: the values each side's behaviour implies, where they differ."""
    fitted: dict[tuple, dict] = {}
    for r in records:
        if r.get("fitted"):
            fitted.setdefault((r["op"], r.get("key")), {})[r["side"]] = r["fitted"]["value"]
    return [f"{key}: train behaves as {v['train']!r}, rollout as {v['rollout']!r}"
            for (_op, key), v in fitted.items() if set(v) == set(SIDES) and v["train"] != v["rollout"]]


def _forward_side(f: dict, forward: dict | None) -> list[str]:
    """Name the side from the reference forward where the exact evidence (parameters, replays,
    configs) left it undetermined; the next check it implies. A forward that names another side
    than the exact evidence is noted in the reason."""
    side, why = side_from_forward(forward)
    if not side:
        return []
    if f.get("side") not in (None, UNDETERMINED, side):
        f["side_reason"] = f"{f.get('side_reason') or ''} (the reference forward says {side}: {why})".strip()
        return []
    if f.get("side") != side:
        f["side"], f["side_reason"] = side, why
    hyp = (forward.get("reproduced_by") or {}).get(side) if side != BOTH else None
    dep = (forward.get(side) or {}).get("departure") if side != BOTH else None
    if hyp and dep:
        return [f"The {side} side leaves the reference forward at {dep['point']}; injecting '{hyp[0]}' into the "
                f"reference reproduces it: check that on the {side} side."]
    return []


def decide(ev: Evidence, f: dict, m: dict) -> list[str]:
    """Add ``side_evidence`` and ``config_keys`` to finding ``f`` and name the side they prove.

    Returns next checks naming the exact tensor or key to fix (first in the finding's list).
    """
    replays = replay_evidence(ev, f) if f["category"] != "parameter_or_checkpoint_issue" else []
    if ev.compare.get("reference") and not checkpoint_fits(ev):
        # Another model's (or step's) checkpoint: what differs from it says nothing about either side.
        if f.get("side") in (None, UNDETERMINED):
            f["side"], f["side_reason"] = UNDETERMINED, unfit_reason(ev)
        return []
    if not ev.compare.get("reference"):
        differ = _disagreements(replays)
        if differ:
            f["side_evidence"] = replays
            f["config_keys"] = sorted({r["key"] for r in replays if r.get("key")})
            borrowed = sorted({f"the {r['side']} side's experts rebuilt with the {r['expert_weights']} dump's expert "
                               f"weights" for r in ev.compare.get("replays") or []
                               if r.get("expert_weights") in SIDES
                               and any(r["module"] == p or r["module"].startswith(p + ".") for p in _modules(f, r["side"]))})
            return [f"The sides compute this module with different values (replayed from their own tensors"
                    f"{''.join('; ' + b for b in borrowed)}): {'; '.join(differ)}. Rerun with --model to decide "
                    f"which one the checkpoint's config sets."]
        return []
    params = parameter_evidence(ev, m)
    keys, configs = config_evidence(ev, f.get("role"))
    # A departure carried back to this module (departures.py) concerns it through the pair it departed at.
    through = (f.get("evidence") or {}).get("carried_through")
    forward = forward_evidence(ev, ev.pair(through["pair"]) if through else m)
    f["side_evidence"] = params + replays + configs + ([forward] if forward else [])
    # A weight finding is explained by tensors, not keys.
    f["config_keys"] = [] if f["category"] == "parameter_or_checkpoint_issue" else keys
    checks = []
    if f["category"] == "parameter_or_checkpoint_issue":
        side, why = side_from_parameters(params)
        if side:
            f["side"], f["side_reason"] = side, why
            for rec in params:
                for s in ([side] if side != BOTH else list(SIDES)):
                    if (rec.get(s) or {}).get("matches_reference") is False:
                        names = ", ".join(rec[s].get("checkpoint_tensors") or [rec["point"]])
                        checks.append(f"Reload {names} on the {s} side from the checkpoint (its {rec['point']} "
                                      f"differs: {rec[s].get('detail')}).")
        return checks + _forward_side(f, forward)
    side, why = side_from_replays(replays, exact_module=f.get("train_module") == _path(m, "train"))
    if side and f.get("side") in (None, UNDETERMINED):
        f["side"], f["side_reason"] = side, why
        for r in replays:
            if side == BOTH or r["side"] == side:
                if r.get("reproduces_reference") is False:
                    checks.append(f"Set {r['key']} to {r['reference_value']!r} on the {r['side']} side: its "
                                  f"{r['module']} computes with {r['key']}={r['fitted']['value']!r} "
                                  f"(replay residual {r['fitted']['residual']:.2g}).")
        keys = sorted(set(keys) | {r["key"] for r in replays if r.get("reproduces_reference") is False})
        f["config_keys"] = keys
    # Only keys that govern this module's role decide its side (any key when the role has no list).
    governing = set(keys) or {c["key"] for c in configs}
    decided = [c for c in configs if c.get("differs_from_checkpoint") and c["key"] in governing]
    if decided and f.get("side") in (None, UNDETERMINED):
        sides = {c["differs_from_checkpoint"] for c in decided}
        f["side"] = sides.pop() if len(sides) == 1 else BOTH
        f["side_reason"] = ("the " + f["side"] + " side resolved " + ", ".join(
            f"{c['key']}={c[c['differs_from_checkpoint']]!r}" for c in decided) + " where the checkpoint's config says "
            + ", ".join(f"{c['key']}={c['checkpoint']!r}" for c in decided))
    for c in decided:
        s = c["differs_from_checkpoint"]
        checks.append(f"Set {c['key']} to {c['checkpoint']!r} on the {s} side (it resolved {c[s]!r}).")
    return checks + _forward_side(f, forward)
