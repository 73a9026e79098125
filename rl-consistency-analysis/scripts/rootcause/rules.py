"""The triage rules as a table: condition, category, base score and the adjustments to it.

``triage.py`` computes the facts of one suspect pair (``triage.Suspect``); the conditions below
only read those facts, so every rule is one row here and one paragraph, with its reason, in
references/analysis_rules.md. Each finding in output_5 lists the ids of the rows that fired.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Rule:
    """A category decision: the first row whose condition holds classifies the suspect."""
    id: str
    category: str
    base: float | None      # None: keeps the score of the rule that classified the finding
    condition: Callable[[object], bool]
    reason: str


@dataclass(frozen=True)
class Adjustment:
    """A change to the base score when its condition holds; ``note`` is shown with the finding."""
    id: str
    delta: float
    condition: Callable[[object], bool]
    note: str


@dataclass(frozen=True)
class Screen:
    """A structural reason to set a candidate aside instead of classifying it."""
    id: str
    condition: Callable[[object], bool]
    reason: str


SCREENS = (
    Screen("fused_mismatch_realigns", lambda s: s.fused_realigns,
           "a fused or by-design pair whose mismatch vanishes downstream is a layout artefact"),
    Screen("outputs_structural", lambda s: s.outputs_structural,
           "every output comparison is structural (shards, padding): the values were not compared"),
    Screen("routing_flip", lambda s: (s.routing or {}).get("verdict") == "flips_only",
           "a mixture-of-experts pair whose routing differs only where the logits tie within precision"),
)

# Relative output error from which a difference is not precision-sized (analysis_rules.md,
# "Size of the error"): 10x the bf16 tolerance, past fp8 rounding, and what two outputs whose
# cosine is below about 0.95 differ by.
UNCORRELATED_ERROR = 0.3
# Outputs that are one another times a constant (cosine, or ratios of Max, Min, Mean and Norm
# equal within the comparison's tolerance) are correlated however large the error: a scale, not a
# different weight.
SCALE_COSINE = 0.95
# Relative output error from which two full-precision (fp32/fp64) outputs of one input are not any
# rounding the engines could have done inside (analysis_rules.md, "A hidden weight in full
# precision"): past bf16 compute (tolerance 0.03) by three times, at fp8 rounding's size.
FULL_PRECISION_FAR = 0.1

# Order matters: the first row whose condition holds decides the category.
RULES = (
    Rule("parameters_differ", "parameter_or_checkpoint_issue", 0.9, lambda s: s.parameters_differ,
         "the pair's own weights differ, or a fused output agrees while a part of it differs"),
    Rule("routing_differs", "in_module_impl_difference", 0.85,
         lambda s: (s.routing or {}).get("verdict") == "systematic" and not s.inputs_diverged,
         "routing replayed from each side's own router logits differs beyond a tie: a routing config differs"),
    Rule("precision_boundary", "in_module_impl_difference", 0.7, lambda s: s.precision_origin,
         "inputs agree in value and dtype, the output dtype differs: precision changes in this module"),
    Rule("extra_op_before_observer", "missing_or_extra_op_between_aligned_boundary", 0.75,
         lambda s: s.op_before_observer is not None,
         "one side shows the suspect's output only after an unexpected one-sided module"),
    Rule("unobserved_weight_uncorrelated", "parameter_or_checkpoint_issue", 0.7,
         lambda s: s.origin and s.parameters_unobserved and s.uncorrelated,
         "one side's weights are not in the dump and the outputs are uncorrelated: a weight difference leads"),
    Rule("unobserved_weight_full_precision", "parameter_or_checkpoint_issue", 0.6,
         lambda s: s.origin and s.parameters_unobserved and s.holds_weights and s.full_precision_far,
         "a module that holds weights, one side's not in the dump, its compared inputs agree in full precision "
         "and its outputs differ far past any rounding: a weight difference is more likely than a kernel"),
    Rule("origin_in_module", "in_module_impl_difference", 0.8, lambda s: s.origin,
         "inputs and parameters agree, the output differs"),
    Rule("extra_op_between", "missing_or_extra_op_between_aligned_boundary", 0.75,
         lambda s: s.op_between is not None,
         "an unexpected one-sided module sits between a clean aligned boundary and the suspect"),
    Rule("fused_split_differs", "parameter_or_checkpoint_issue", 0.75,
         lambda s: s.split_boundary is not None,
         "the previous aligned fused output agrees while its parts, as the next modules get them, differ"),
    Rule("inline_op_between", "missing_or_extra_op_between_aligned_boundary", 0.6,
         lambda s: s.nothing_between and s.boundary_breaks,
         "the previous aligned output agrees, the next input does not, and no module runs between"),
    Rule("impl_in_container", "in_module_impl_difference", 0.65, lambda s: s.container is not None,
         "the boundary breaks with only expected one-sided modules between: inside the enclosing module"),
    Rule("impl_inline", "in_module_impl_difference", 0.8, lambda s: True,
         "the boundary breaks with nothing unexpected between and no enclosing module"),
)

# Applied after RULES, to a finding whose category is already decided.
PROPAGATION = Rule("behind_accepted_cause", "upstream_propagation", None,
                   lambda s: s.inputs_diverged,
                   "behind an accepted root cause, diverged inputs are most simply its propagation")
# Applied when no candidate explains a divergence (issue 11 rule 3).
BEFORE_RANGE = Rule("cause_before_dumped_range", "upstream_propagation", 0.6,
                    lambda s: s.inputs_diverged and s.first_compared,
                    "the first dumped aligned modules already receive diverged inputs: the cause is earlier")
PROPAGATION_EXAMPLE = Rule("carries_cause", "upstream_propagation", 0.9, lambda s: True,
                           "right after a root cause, a module whose inputs carry the divergence")

ADJUSTMENTS = (
    Adjustment("inputs_diverged", -0.15, lambda s: s.rule == "parameters_differ" and not s.inputs_clean_or_none,
               "the module's inputs differ too, so part of the output difference comes from upstream"),
    Adjustment("activation_like_op", 0.15, lambda s: s.rule.startswith("extra_op") and s.activation_like_op,
               "the one-sided module is activation-like"),
    Adjustment("inputs_inferred", -0.3, lambda s: s.rule == "origin_in_module" and s.inputs_inferred,
               "the inputs were not compared; the previous aligned module's output stands in for them"),
    Adjustment("small_margin", -0.15, lambda s: s.small_margin,
               "output differs only slightly beyond tolerance"),
    Adjustment("internal_only", -0.2, lambda s: s.internal_only,
               "the divergence does not reach the model output (internal mismatch only)"),
    Adjustment("realigns_unexplained", -0.25, lambda s: s.realigns and not s.fused,
               "later neighbouring modules realign without a boundary explanation"),
    Adjustment("realigns_fused", 0.0, lambda s: s.realigns and s.fused,
               "later modules realign, explained by the fused boundary"),
)


def first_rule(suspect) -> Rule:
    """The row that classifies ``suspect`` (the last row always holds)."""
    return next(r for r in RULES if r.condition(suspect))


def first_screen(suspect) -> Screen | None:
    """The screen that sets ``suspect`` aside, or None."""
    return next((s for s in SCREENS if s.condition(suspect)), None)


def by_id(rule_id: str) -> Rule:
    """A category row by its id (PROPAGATION rows included)."""
    return next(r for r in RULES + (PROPAGATION, BEFORE_RANGE, PROPAGATION_EXAMPLE) if r.id == rule_id)


def adjustments(suspect) -> list[Adjustment]:
    """The adjustments that hold for a classified suspect, in table order."""
    return [a for a in ADJUSTMENTS if a.condition(suspect)]

# The departure row that names no cause beyond "computes otherwise" (triage._with_reference).
WEAK_DEPARTURE = "reference_departs_in_module"

# Findings from the reference forward (departures.py): where one side's own values first leave a
# forward of the checkpoint over that side's tokens, judged call by call in that side's layout. The
# first row whose condition holds decides; the facts are departures.Departure's.
DEPARTURE_RULES = (
    Rule("reference_weight_differs", "parameter_or_checkpoint_issue", 0.9, lambda d: d.weight_differs,
         "the departing side's own weight of the module differs from the checkpoint"),
    Rule("reference_simulated_layout", "parameter_or_checkpoint_issue", 0.85, lambda d: d.reproduced_by("layout", "weight"),
         "a weight layout or the side's own weight, injected into the reference, reproduces the side"),
    Rule("reference_simulated_config", "in_module_impl_difference", 0.85, lambda d: d.reproduced_by("config"),
         "a config value, injected into the reference, reproduces the side"),
    Rule("reference_simulated_precision", "in_module_impl_difference", 0.7, lambda d: d.reproduced_by("dtype"),
         "the reference in the other precision reproduces the side"),
    Rule("reference_unseen_weight", "parameter_or_checkpoint_issue", 0.7, lambda d: d.weight_unseen,
         "the module's input matches the reference and its output does not, its weight is not in the dump and "
         "no layout, config or precision candidate reproduces it: its own weight changed"),
    Rule("reference_carried_from_unseen_weight", "parameter_or_checkpoint_issue", 0.55,
         lambda d: d.carried_from is not None,
         "the departing module's weights match the checkpoint and no candidate reproduces it, so it only "
         "carries a drift that entered earlier; every weight upstream is seen to match the checkpoint but "
         "one module's, which the dump does not show, and that module's output is already further from "
         "the reference than the other side's: its weight changed"),
    Rule("reference_departs_in_module", "in_module_impl_difference", 0.6, lambda d: True,
         "the module's weights match the checkpoint (or it has none) and its output departs: it computes "
         "differently, by no candidate the simulation tries"),
)
