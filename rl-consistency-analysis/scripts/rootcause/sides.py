"""Which side is wrong: the reference checkpoint and the configs each side resolved.

Reads what the compare step wrote with ``--model`` (output_3 ``reference``: per side, the
checkpoint, the config and, per parameter, ``matches_reference``) and turns it into a finding's
``side``, ``side_evidence`` and ``config_keys``. How each side is decided, and when it cannot be:
references/deciding_the_side.md.
"""
from __future__ import annotations

from .evidence import Evidence
from .hypotheses import config_keys

SIDES = ("train", "rollout")


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


def _param_results(ev: Evidence, m: dict) -> list[dict]:
    return [ev.results[p["cid"]] for p in m["points"]["param"] if p.get("cid") in ev.results]


def parameter_evidence(ev: Evidence, m: dict) -> list[dict]:
    """One ``reference_parameters`` record per parameter of ``m`` that the reference judged."""
    out = []
    for r in _param_results(ev, m):
        ref = r.get("reference") or {}
        if not ref:
            continue
        rec = {"kind": "reference_parameters", "point": r["point"]}
        for side in SIDES:
            s = ref.get(side)
            if s:
                rec[side] = {k: s.get(k) for k in ("matches_reference", "how", "exact", "layout", "detail",
                                                   "checkpoint_tensors")}
        out.append(rec)
    return out


def side_from_parameters(records: list[dict]) -> tuple[str | None, str | None]:
    """(side, reason) from reference_parameters records; (None, None) when they do not decide."""
    wrong = {s for rec in records for s in SIDES if (rec.get(s) or {}).get("matches_reference") is False}
    right = {s for s in SIDES if records and all((rec.get(s) or {}).get("matches_reference") is True
                                                   for rec in records)}
    if wrong == set(SIDES):
        return "both", "both sides' parameters differ from the reference checkpoint"
    if len(wrong) == 1:
        bad = wrong.pop()
        other = "rollout" if bad == "train" else "train"
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


def decide(ev: Evidence, f: dict, m: dict) -> list[str]:
    """Add ``side_evidence`` and ``config_keys`` to finding ``f`` and name the side they prove.

    Returns next checks naming the exact tensor or key to fix (first in the finding's list).
    """
    if not ev.compare.get("reference"):
        return []
    params = parameter_evidence(ev, m)
    keys, configs = config_evidence(ev, f.get("role"))
    f["side_evidence"] = params + configs
    # A weight finding is explained by tensors, not keys.
    f["config_keys"] = [] if f["category"] == "parameter_or_checkpoint_issue" else keys
    checks = []
    if f["category"] == "parameter_or_checkpoint_issue":
        side, why = side_from_parameters(params)
        if side:
            f["side"], f["side_reason"] = side, why
            for rec in params:
                for s in ([side] if side != "both" else list(SIDES)):
                    if (rec.get(s) or {}).get("matches_reference") is False:
                        names = ", ".join(rec[s].get("checkpoint_tensors") or [rec["point"]])
                        checks.append(f"Reload {names} on the {s} side from the checkpoint (its {rec['point']} "
                                      f"differs: {rec[s].get('detail')}).")
        return checks
    # Only keys that govern this module's role decide its side (any key when the role has no list).
    governing = set(keys) or {c["key"] for c in configs}
    decided = [c for c in configs if c.get("differs_from_checkpoint") and c["key"] in governing]
    if decided and f.get("side") in (None, "undetermined"):
        sides = {c["differs_from_checkpoint"] for c in decided}
        f["side"] = sides.pop() if len(sides) == 1 else "both"
        f["side_reason"] = ("the " + f["side"] + " side resolved " + ", ".join(
            f"{c['key']}={c[c['differs_from_checkpoint']]!r}" for c in decided) + " where the checkpoint's config says "
            + ", ".join(f"{c['key']}={c['checkpoint']!r}" for c in decided))
    for c in decided:
        s = c["differs_from_checkpoint"]
        checks.append(f"Set {c['key']} to {c['checkpoint']!r} on the {s} side (it resolved {c[s]!r}).")
    return checks
