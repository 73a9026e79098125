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
        return "both", "neither side's output is reproduced by the reference config's math"
    if len(wrong) == 1:
        bad = wrong.pop()
        other = "rollout" if bad == "train" else "train"
        r = next(x for x in judged if x["side"] == bad and not x["reproduces_reference"])
        tail = ("the other side's is reproduced by the reference" if other in seen else
                f"the {other} side computes it inline, where it is not replayed")
        return bad, (f"replayed from its own inputs, the {bad} side's {r['module']} is reproduced by "
                     f"{r['key']}={r['fitted']['value']!r} (residual {r['fitted']['residual']:.2g}), not by the "
                     f"reference {r['key']}={r['reference_value']!r} (residual {r['residual_at_reference']:.2g}); "
                     + tail)
    if exact_module and seen == set(SIDES) and not wrong:
        return "neither", ("both sides' outputs are reproduced by the reference config's math: the difference "
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


def decide(ev: Evidence, f: dict, m: dict) -> list[str]:
    """Add ``side_evidence`` and ``config_keys`` to finding ``f`` and name the side they prove.

    Returns next checks naming the exact tensor or key to fix (first in the finding's list).
    """
    replays = replay_evidence(ev, f) if f["category"] != "parameter_or_checkpoint_issue" else []
    if not ev.compare.get("reference"):
        differ = _disagreements(replays)
        if differ:
            f["side_evidence"] = replays
            f["config_keys"] = sorted({r["key"] for r in replays if r.get("key")})
            return [f"The sides compute this module with different values (replayed from their own tensors): "
                    f"{'; '.join(differ)}. Rerun with --model to decide which one the checkpoint's config sets."]
        return []
    params = parameter_evidence(ev, m)
    keys, configs = config_evidence(ev, f.get("role"))
    f["side_evidence"] = params + replays + configs
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
    side, why = side_from_replays(replays, exact_module=f.get("train_module") == _path(m, "train"))
    if side and f.get("side") in (None, "undetermined"):
        f["side"], f["side_reason"] = side, why
        for r in replays:
            if side == "both" or r["side"] == side:
                if r.get("reproduces_reference") is False:
                    checks.append(f"Set {r['key']} to {r['reference_value']!r} on the {r['side']} side: its "
                                  f"{r['module']} computes with {r['key']}={r['fitted']['value']!r} "
                                  f"(replay residual {r['fitted']['residual']:.2g}).")
        keys = sorted(set(keys) | {r["key"] for r in replays if r.get("reproduces_reference") is False})
        f["config_keys"] = keys
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
