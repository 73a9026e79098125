#!/usr/bin/env python3
"""Check the evidence-criteria block (P5) in a project's AGENTS.md.

Rules: the block is present with GOAL, OPTIMISING, PERVERSE SATISFACTIONS, EVIDENCE A, EVIDENCE B
and ELSE in that order, none empty or left as a template placeholder; OPTIMISING is a single
plain sentence without symbols; there are 2-3 perverse satisfactions, each naming a metric or an
arm that would catch it: a metric described in words ("the fraction of answers that ...", "the
refusal rate") stands on its own, while an arm or a logged key (`kl`) must be one the document
names elsewhere too (EVIDENCE A, a metrics list ...), so "exposed by a metric." names nothing;
EVIDENCE A names the bare, treatment, reversed and placebo arms; EVIDENCE B names a baseline
other than chance and a metric (in words, in backticks or as a logger path).
Exit 0 clean, 1 findings, 2 unreadable input.
"""
from __future__ import annotations

import re

from mldebug_common import Finding, ReadSummary, check_documents, count_lines, run

TOOL = "check_evidence_criteria"
KEYS = ("GOAL", "OPTIMISING", "PERVERSE SATISFACTIONS", "EVIDENCE A", "EVIDENCE B", "ELSE")
KEY_LINE = re.compile(r"^\s*(?:[-*]\s+)?\**(GOAL|OPTIMI[SZ]ING|PERVERSE SATISFACTIONS|EVIDENCE A|"
                      r"EVIDENCE B|ELSE)\b[^:\n]*:\**\s*(.*)$")
PLACEHOLDER = re.compile(r"<[^<>]*\s[^<>]*>")
ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)]|\(\d+\))\s+(.*)$")
SYMBOLS = re.compile(r"[=$\\^_\u2207\u2202\u2211\u220f\u2248\u2264\u2265\u0370-\u03ff]")
ABBREVIATIONS = re.compile(r"\b(e\.g|i\.e|etc|vs|cf)\.", re.IGNORECASE)
# What an exposure can name: a code span, an identifier (`train/loss`, `pass@1`, `copy_rate`), the word
# before "metric", "arm", "baseline" ..., a standard arm, or a usual metric word.
CODE_SPAN = re.compile(r"`([^`]+)`")
IDENTIFIER = re.compile(r"\b[A-Za-z]\w*(?:[_/.@]\w+)+\b")
NAMED_BEFORE = re.compile(r"([\w@/.-]+)\s+(?:metric|arm|baseline|control|probe|score|rate)\b", re.IGNORECASE)
NOT_NAMES = {"a", "an", "the", "by", "any", "one", "some", "this", "that", "same", "control", "its", "our"}
ARMS = ("bare", "treatment", "reversed", "placebo")
BASELINE = re.compile(r"\bbaseline\b|\b(beats?|outperforms?|vs\.?|versus|compared (with|to)|"
                      r"better than)\s+(?:the\s+|a\s+)?(?!chance\b|random\b)\w", re.IGNORECASE)
METRIC_WORDS = re.compile(r"\b(accuracy|f1|auc|loss|bleu|rouge|pass@\d+|exact match|win rate|mse|mae|"
                          r"rmse|perplexity|reward|return|score)\b", re.IGNORECASE)
# A metric named in words: "the fraction of answers that ...", "the refusal rate", "answer length".
# Such a name describes the measurement itself, so it needs no definition elsewhere; an arm or a
# logged key does (an arm that is not in the design is never run, a key that is not logged is never read).
PLAIN_METRIC = re.compile(r"\b(?:fraction|share|proportion|percentage|rate|number|count|mean|average|median|"
                          r"variance|distribution)\s+of\s+(?:the\s+|its\s+)?[a-z]+|"
                          r"\b(?!(?:a|an|the|any|one|some|this|that|same|its|our)\b)[a-z][\w-]*\s+"
                          r"(?:rate|ratio|length|entropy|accuracy|error|frequency|share|probability|"
                          r"log-probability|likelihood|margin|loss|reward|norm|divergence)\b|"
                          r"\b(?:accuracy|f1|auc|bleu|rouge|pass@\d+|exact match|win rate|perplexity|"
                          r"mse|mae|rmse)\b", re.IGNORECASE)
NEEDS_DEFINITION = re.compile(r"([\w@/.-]+)\s+(?:arm|baseline|control|probe)\b", re.IGNORECASE)
# EVIDENCE B may name its metric in words, in a code span (`eval/exact_match`) or as a logger path.
METRIC = re.compile(r"\bmetric\b|\bon\s+(?:the\s+)?[\w@/-]+|`[^`]*\w[^`]*`|" + IDENTIFIER.pattern + "|"
                    + METRIC_WORDS.pattern, re.IGNORECASE)


def extract_block(lines: list[str]) -> dict[str, tuple[int, list[str]]]:
    """Find the block's keys: key -> (line number, value lines), with continuation lines joined.

    A value runs until the next key, a heading, a code fence, or a blank line followed by text that
    is neither indented nor a list item (the end of the block inside a larger AGENTS.md).
    """
    block: dict[str, tuple[int, list[str]]] = {}
    current: str | None = None
    for i, text in enumerate(lines):
        m = KEY_LINE.match(text)
        if m:
            key = "OPTIMISING" if m.group(1).startswith("OPTIMI") else m.group(1)
            if key in block:
                current = None
                continue
            current = key
            block[key] = (i + 1, [m.group(2)] if m.group(2).strip() else [])
            continue
        if current is None:
            continue
        stripped = text.strip()
        if stripped.startswith(("#", "```", "~~~")):
            current = None
        elif not stripped:
            nxt = next((ln for ln in lines[i + 1:] if ln.strip()), "")
            if nxt and not nxt[0].isspace() and not ITEM.match(nxt) and not KEY_LINE.match(nxt):
                current = None
        else:
            block[current][1].append(text)
    return block


def sentences(text: str) -> list[str]:
    """Split prose into sentences, ignoring the full stops of common abbreviations."""
    masked = ABBREVIATIONS.sub(lambda m: m.group(0).replace(".", "\u2024"), text)
    return [s for s in re.split(r"(?<=[.!?])\s+", masked.strip()) if s.strip()]


def check_block(path: str, text: str) -> list[Finding]:
    """Apply every P5 evidence-criteria rule to one file."""
    findings: list[Finding] = []

    def add(line: int, rule: str, message: str) -> None:
        findings.append(Finding(path, line, rule, message))

    block = extract_block(text.splitlines())
    if not block:
        add(1, "EC-MISSING", "no evidence-criteria block (GOAL, OPTIMISING, PERVERSE SATISFACTIONS, "
            "EVIDENCE A, EVIDENCE B, ELSE); copy ml-debug/assets/AGENTS_evidence_block.md")
        return findings
    first_line = min(line for line, _ in block.values())
    for key in KEYS:
        if key not in block:
            add(first_line, "EC-KEY-MISSING", f"block lacks '{key}:'")
    present = [k for k in sorted(block, key=lambda k: block[k][0])]
    if present != [k for k in KEYS if k in block]:
        add(first_line, "EC-KEY-ORDER", f"keys must come in the order {', '.join(KEYS)}; found "
            f"{', '.join(present)}")
    values = {}
    for key, (line, value_lines) in block.items():
        value = " ".join(v.strip() for v in value_lines).strip()
        values[key] = value
        if not value:
            add(line, "EC-EMPTY", f"'{key}' is empty")
        elif PLACEHOLDER.search(value):
            add(line, "EC-PLACEHOLDER", f"'{key}' still holds template text "
                f"'{PLACEHOLDER.search(value).group(0)[:60]}'")
    if values.get("OPTIMISING") and not PLACEHOLDER.search(values["OPTIMISING"]):
        line = block["OPTIMISING"][0]
        if len(sentences(values["OPTIMISING"])) > 1:
            add(line, "EC-OPTIMISING-SENTENCE", "OPTIMISING must be one sentence")
        sym = SYMBOLS.search(values["OPTIMISING"])
        if sym:
            add(line, "EC-OPTIMISING-SYMBOLS", f"OPTIMISING must use plain words, no symbols "
                f"(found '{sym.group(0)}')")
    if "PERVERSE SATISFACTIONS" in block and values["PERVERSE SATISFACTIONS"] and not \
            PLACEHOLDER.search(values["PERVERSE SATISFACTIONS"]):
        check_perverse(block["PERVERSE SATISFACTIONS"], text, add)
    if values.get("EVIDENCE A") and not PLACEHOLDER.search(values["EVIDENCE A"]):
        missing = [a for a in ARMS if not re.search(rf"\b{a}\b", values["EVIDENCE A"], re.IGNORECASE)]
        if missing:
            add(block["EVIDENCE A"][0], "EC-ARMS", f"EVIDENCE A must name its arms; missing: "
                f"{', '.join(missing)}")
    if values.get("EVIDENCE B") and not PLACEHOLDER.search(values["EVIDENCE B"]):
        line, value = block["EVIDENCE B"][0], values["EVIDENCE B"]
        if not BASELINE.search(value):
            add(line, "EC-BASELINE", "EVIDENCE B must name a baseline to beat (chance alone is not one)")
        if not METRIC.search(value):
            add(line, "EC-METRIC", "EVIDENCE B must name the metric, e.g. 'beats X on exact match'")
    return findings


def check_perverse(entry: tuple[int, list[str]], document: str, add) -> None:
    """2-3 perverse satisfactions, each a list item naming a metric or arm the document defines."""
    line, value_lines = entry
    items: list[str] = []
    for text in value_lines:
        m = ITEM.match(text)
        if m:
            items.append(m.group(1))
        elif items:
            items[-1] += " " + text.strip()
    if not items:
        add(line, "EC-PERVERSE-COUNT", "write each perverse satisfaction as a list item ('- ...')")
        return
    if not 2 <= len(items) <= 3:
        add(line, "EC-PERVERSE-COUNT", f"{len(items)} perverse satisfaction(s); write 2-3")
    for n, item in enumerate(items, 1):
        if PLAIN_METRIC.search(CODE_SPAN.sub(" ", item)):
            continue
        names = exposure_names(item)
        rest = document.replace(item, " ")
        # A logger path counts when the document names it with or without its group (`eval/x`, `x`).
        if not any(re.search(rf"(?<![\w-]){re.escape(form)}(?![\w-])", rest, re.IGNORECASE)
                   for name in names for form in {name, name.rsplit("/", 1)[-1]}):
            named = f" (it names {', '.join(sorted(names))}, found nowhere else)" if names else ""
            add(line, "EC-PERVERSE-EXPOSE", f"perverse satisfaction {n} does not name a metric or arm "
                f"that the document defines{named}; name the logged metric or the arm that catches it")


def exposure_names(item: str) -> set[str]:
    """Names an item gives that the document must define: code spans, identifiers, "X arm", arms, "X metric"."""
    names = {m.strip() for m in CODE_SPAN.findall(item)} | set(IDENTIFIER.findall(CODE_SPAN.sub(" ", item)))
    names |= {m.strip(".-") for m in NAMED_BEFORE.findall(item) if m.lower() not in NOT_NAMES}
    names |= {m.strip(".-") for m in NEEDS_DEFINITION.findall(item) if m.lower() not in NOT_NAMES}
    # An arm word names the arm only as one ("the placebo", "the bare arm"); "a bare number" names nothing.
    names |= {a for a in ARMS if re.search(rf"\bthe\s+{a}\b|\b{a}\s+(?:arm|run|model|checkpoint)\b", item,
                                           re.IGNORECASE)}
    names |= {m.group(0) for m in METRIC_WORDS.finditer(item)}
    return {n for n in names if n}


def check_file(path: str, text: str) -> tuple[list[Finding], ReadSummary]:
    """The findings of one file and what was read: the block's keys, and repeated keys set aside."""
    lines = text.splitlines()
    keys = [m.group(1) for m in map(KEY_LINE.match, lines) if m]
    seen = list(dict.fromkeys(keys))
    repeated = {k: "repeated; the first is read" for k in seen if keys.count(k) > 1}
    return check_block(path, text), ReadSummary(path, "markdown", count_lines(text), seen, repeated, "keys")


def main() -> int:
    """Check each file given on the command line and return the exit code."""
    return check_documents(TOOL, __doc__, "Template: ml-debug/assets/AGENTS_evidence_block.md. "
                           "Exit 0 clean, 1 findings, 2 unreadable input.", "AGENTS.md",
                           "file(s) holding the block", check_file)


if __name__ == "__main__":
    run(TOOL, main)
