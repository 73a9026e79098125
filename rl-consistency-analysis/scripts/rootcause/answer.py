"""The answer in a person's words: what output_5 ``answer`` holds and what the console and
report.html show first (verdict, root cause, side, confidence, next check).

One place turns the identifiers of output_5 (verdicts, categories) into words, so that no view
prints a JSON name to a person; FIELD_NAMES is the published list of names a view never shows.
"""
from __future__ import annotations

from . import commands, sides

VERDICT_WORDS = {
    "root_cause_found": "root cause found",
    "precision_only": "only precision differences: nothing beyond the rounding of the dtypes",
    "no_credible_divergence": "no credible divergence: the compared tensors agree within tolerance",
    "inconclusive": "inconclusive: tensors differ but no credible origin was found",
}
CATEGORY_WORDS = {
    "parameter_or_checkpoint_issue": "a weight differs (parameters or checkpoint)",
    "missing_or_extra_op_between_aligned_boundary": "an operation runs on one side only",
    "in_module_impl_difference": "the module computes differently (implementation, config or precision)",
    "upstream_propagation": "a divergence carried in from earlier modules",
}
UNCALIBRATED = "uncalibrated"
# JSON names a person never reads in the console or report.html (tests/rootcause/test_answer_first.py
# checks both views against it and that it covers every name of output_5 written with an underscore).
FIELD_NAMES = (
    "schema_version", "root_causes", "other_candidates", "first_divergence", "reaches_output", "reference_forward",
    "side_reason", "side_evidence", "missing_on", "op_module", "train_module", "rollout_module", "confidence_word",
    "confidence_notes", "confidence_text", "category_text", "next_checks", "config_keys", "rules_fired", "suspect_pair",
    "finding_pair", "previous_aligned", "differing_points", "differing_parameters", "output_error_margin",
    "diverged_calls", "other_calls", "pairs_of_these_modules", "aligned_by", "rank_reason", "module_priority_rank", "input_status", "input_status_source",
    "parameter_status", "output_status", "structural_clean", "structural_different", "structural_not_compared",
    "suppressed", "max_rel", "min_rel", "mean_rel", "norm_rel", "stat_errors", "mean_abs_diff", "max_abs_diff",
    "clean_level", "per_token_logprob", "logits_statistics", "root_cause_found", "precision_only",
    "no_credible_divergence", "parameter_or_checkpoint_issue", "missing_or_extra_op_between_aligned_boundary",
    "in_module_impl_difference", "upstream_propagation", "decide_side", "nothing_compared", "input_notes",
)


def confidence_text(confidence, word: str | None) -> str:
    """The confidence as a person reads it: never a bare score beside "uncalibrated"."""
    if word == UNCALIBRATED or not word:
        return f"rule score {confidence}, not calibrated on the test corpora (no likelihood word)"
    return f"{confidence} ({word})"


def names(x) -> str:
    """Module path(s) of one side, '-' when the side has none."""
    if x is None:
        return "-"
    return ", ".join(x) if isinstance(x, list) else str(x)


def _activations(doc: dict) -> dict:
    """output_4 ``comparability.activations`` as output_5 carries it ({} when absent)."""
    return (doc.get("comparability") or {}).get("activations") or {}


def _nothing_compared(doc: dict) -> str | None:
    comp = doc.get("comparability") or {}
    codes, reasons = comp.get("codes") or [], comp.get("reasons") or []
    # output_4 comparability.codes runs beside reasons (output_schemas.md); decided by the code.
    return next((str(r) for c, r in zip(codes, reasons) if c == "nothing_compared"), None)


def _decide_side(top: dict, argv: list[str]) -> dict | None:
    """When the side is undetermined and no checkpoint was given: the rerun with --model that decides it."""
    if top.get("side") != sides.UNDETERMINED:
        return None
    cmd = commands.with_model(argv)
    if cmd is None:
        return None
    return {"check": "rerun with --model set to the checkpoint folder both engines loaded: each side is then held "
                     "against it, and the one that departs is named", "command": cmd}


def _when(top: dict) -> str | None:
    """From which forward call of a generation the finding's side departs, or at how many of the
    calls the dumps hold apart it was found (None for one call)."""
    ev = top.get("evidence") or {}
    again = ev.get("other_calls")
    if again:
        return (f"found at {len(again['pairs']) + 1} of the {again['pairs_of_these_modules']} calls of these "
                f"modules (each call its own entry in the dumps)")
    call, calls = ev.get("first_call"), ev.get("calls")
    if call is None or not calls or calls < 2:
        return None
    which = "the prefill" if call == 0 else f"decode call {call}; call 0 is the prefill"
    return f"from forward call {call} of {calls} on ({which})"


def build(doc: dict, argv: list[str], input_notes: list[str]) -> dict:
    """output_5 ``answer``: the verdict in words, the top root cause, its side and confidence, every
    next check of it with its command, and the notes on the inputs."""
    out = {"verdict": VERDICT_WORDS.get(doc["verdict"], doc["verdict"]), "nothing_compared": _nothing_compared(doc),
           "input_notes": list(input_notes), "root_cause": None, "next_checks": [], "decide_side": None}
    if out["nothing_compared"]:
        out["verdict"] = "inconclusive: nothing was compared"
    elif doc["verdict"] == "inconclusive" and not (doc.get("comparability") or {}).get("comparable", True):
        out["verdict"] = "inconclusive: the two dumps cannot be compared as they are (see the notes)"
    elif doc["verdict"] == "inconclusive" and _activations(doc).get("compared") == 0 and _activations(doc).get(
            "bounded"):
        out["verdict"] = ("inconclusive: consistent, not verified (statistics over one token more only bound "
                          "each other; see the notes)")
    elif doc["verdict"] == "inconclusive" and _activations(doc).get("compared") == 0:
        out["verdict"] = "inconclusive: only parameters were compared, no activation (see the notes)"
    if doc["root_causes"]:
        top = doc["root_causes"][0]
        out["root_cause"] = {
            "what": top["category_text"],
            "where": f"{names(top.get('train_module'))} (train) / {names(top.get('rollout_module'))} (rollout)",
            "layer": top.get("layer"), "when": _when(top), "side": top.get("side"),
            "why_this_side": top.get("side_reason"),
            "confidence": top["confidence_text"],
            "more": len(doc["root_causes"]) - 1}
        out["next_checks"] = top.get("next_checks") or []
        out["decide_side"] = _decide_side(top, argv)
    return out
