"""Which compared outputs a chart of report.html draws one by one when a run has too many: a window
around the point that matters, and the whole run cut into bins for an overview.

Standard library only and no package imports: htmlreport loads this file by path (the root-cause
skill loads htmlreport by path from its sibling folder). The reasons for the numbers are in
references/output_schemas.md ("report.html").
"""
from __future__ import annotations

# A chart draws its items one by one up to LIMIT. At 16 px an item, 600 are 9,600 px: about seven
# screens to scroll, as much as a person reads point by point, and about 300 kB of page (a point,
# its tooltip and its rotated label take about 500 bytes); about 50 decoder layers of one forward
# at the many-module bench pair's 12 outputs a layer. Every committed pair (at most 51) is under it.
LIMIT = 600
# The window opens this many items before its anchor: enough of the outputs leading to a
# divergence to see it start, few enough (800 px) that its mark is on the first screen of the
# scrolled chart; the outputs after it show how it spreads, the longer story.
BEFORE = 50
# Bars of the overview: 250 at 4 px, 1,000 px with the axis beside them, fit a 1,300 px window.
BINS = 250
WIDTH = 1000
# Which status a bar shows, worst first: the graded ones in the order of tolerances.SEVERITY (a
# bar holding one diverged output shows diverged whatever else it holds), then those that are not
# an agreement (bounded: consistent, not verified; incomparable; structural) above a plain match.
SHOWN_FIRST = ("nonfinite", "mismatch", "drift", "bounded", "incomparable", "structural", "match")
_RANK = {s: i for i, s in enumerate(SHOWN_FIRST)}


def window(count: int, anchor: int | None) -> range:
    """The indices drawn one by one among ``count`` items: all of them up to LIMIT, else LIMIT
    of them from BEFORE items before ``anchor`` (the start when there is none), kept inside."""
    if count <= LIMIT:
        return range(count)
    start = max(0, min((anchor or 0) - BEFORE, count - LIMIT))
    return range(start, start + LIMIT)


def bin_count(count: int) -> int:
    """How many bars the overview of ``count`` items has (one item each when they are few)."""
    return min(count, BINS)


def bin_of(index: int, count: int) -> int:
    """The bar of item ``index`` among ``count``: consecutive items, equal shares, none empty
    (an item moves the bar on by at most one while bin_count(count) <= count)."""
    return index * bin_count(count) // count


def worse(a: str | None, b: str) -> str:
    """The one of two statuses a bar shows, by SHOWN_FIRST (a status it does not know comes last)."""
    if a is None:
        return b
    return a if _RANK.get(a, len(SHOWN_FIRST)) <= _RANK.get(b, len(SHOWN_FIRST)) else b
