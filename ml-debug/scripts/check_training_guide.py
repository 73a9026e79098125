#!/usr/bin/env python3
"""Check a TRAINING_GUIDE.md against the ml-debug P5 rules.

Rules: under 180 lines; frontmatter holds only `last_reviewed_job` (integer) and `stages`
(stage -> status); one `##` entry per stage with Purpose, Expected sequence (numbered), Required
observations, Current evidence, Missing evidence, Status, Earliest unsupported link and Main
question; a Status agrees with the frontmatter and pairs a credence word with a number in its range,
except that a stage still `unknown` says only that plus what would fill it; capped lists (5
established observations, 5 live explanations, 3 next tests); no list of possible failure
causes. With --previous, the guide must not have grown and its job number must not go backwards.
Exit 0 clean, 1 findings, 2 unreadable input.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml

from mldebug_common import (Finding, InputError, ReadSummary, check_credence_cell, count_lines, find_credences,
                            is_blank, make_parser, read_text, report, run)

TOOL = "check_training_guide"
MAX_LINES = 180
STATUSES = ("unknown", "uncertain", "partial", "working", "failing")
REQUIRED_FIELDS = ("purpose", "expected sequence", "required observations", "current evidence",
                   "missing evidence", "status", "earliest unsupported link", "main question")
OPTIONAL_FIELDS = ("trained", "theory of change")
CAPS = {"established observations": 5, "live explanations": 5, "next tests": 3}
KNOWN_LABELS = REQUIRED_FIELDS + OPTIONAL_FIELDS + tuple(CAPS)
LABEL = re.compile(r"^\s*(?:[-*]\s+)?\**([A-Za-z][A-Za-z ]*?)\**\s*:\**\s*(.*)$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
BULLET = re.compile(r"^\s*[-*+]\s+\S")
# A marker stands alone and is followed by text; the text is not consumed, so `... 40. 2. next`
# leaves the `2.` for the next match.
INLINE_NUMBERED = re.compile(r"(?<!\S)(\d+)[.)]\s+(?=\S)")
# Hedged claims that are a credence in all but word and number ("probably fine", "seems to work").
HEDGES = re.compile(r"\b(?:probably|presumably|apparently|seems?|seemingly|appears?|looks\s+(?:like|fine|ok|good)"
                    r"|suggests?|likely|unlikely|I\s+(?:think|believe|suspect)|we\s+(?:think|believe|suspect)"
                    r"|most\s+likely|should\s+be\s+(?:fine|ok|working))\b", re.IGNORECASE)
# Cue words of a list of possible failure causes; the structural rule is in check_failure_lists and
# the reasons and known misses in references/checkers.md.
FAILURE_CUES = re.compile(
    r"\b(?:causes?|culprits?|suspects?|risks?|pitfalls?|gotchas?|concerns?|failure(?:\s+modes?)?|failures"
    r"|(?:could|can|might|may)\s+(?:go\s+wrong|break|fail)|what\s+might\s+break|hypothes[ie]s\s+for\s+failure"
    r"|why\s+(?:it|this)\s+(?:might|could|may)\s+(?:fail|not\s+work)|things\s+to\s+(?:suspect|watch)"
    r"|possible\s+reasons)\b", re.IGNORECASE)
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+\S")


def norm_name(name: str) -> str:
    """Normalise a stage name so `Posterior_fit`, `posterior-fit` and `Posterior fit` match."""
    return " ".join(re.split(r"[\s_-]+", name.strip().lower())).strip()


class _UniqueKeyLoader(yaml.SafeLoader):
    """pyyaml's safe loader, except that a repeated key is an error instead of silently winning."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}'",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def parse_frontmatter(lines: list[str]) -> tuple[dict | None, int, list[tuple[int, str]]]:
    """Parse the `---` block at the top with pyyaml's safe loader.

    Returns (mapping, or None when there is no block or it does not parse; line index after the
    block; parse errors as (line, message)).
    """
    if not lines or lines[0].strip() != "---":
        return None, 0, []
    end = next((i for i in range(1, len(lines)) if lines[i].strip() in ("---", "...")), None)
    if end is None:
        return None, 0, [(1, "frontmatter opens with '---' but never closes")]
    try:
        data = yaml.load("\n".join(lines[1:end]), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 2 if mark else 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return None, end + 1, [(line, f"frontmatter is not valid YAML: {problem}")]
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return None, end + 1, [(2, f"frontmatter must be a mapping of keys, got {type(data).__name__}")]
    return data, end + 1, []


@dataclass
class Section:
    """A `#` or `##` heading and the lines under it, down to the next such heading."""

    title: str
    level: int
    line: int
    body: list[tuple[int, str]] = field(default_factory=list)


def split_sections(lines: list[str], start: int) -> list[Section]:
    """Split the body after the frontmatter at `#` and `##` headings outside code fences."""
    sections: list[Section] = []
    in_fence = False
    for i in range(start, len(lines)):
        text = lines[i]
        if text.strip().startswith(("```", "~~~")):
            in_fence = not in_fence
        m = None if in_fence else HEADING.match(text)
        # Deeper headings stay inside the entry so a stage can hold "### Next tests".
        if m and len(m.group(1)) <= 2:
            sections.append(Section(m.group(2), len(m.group(1)), i + 1))
        elif sections:
            sections[-1].body.append((i + 1, text))
    return sections


def labelled_fields(body: list[tuple[int, str]]) -> dict[str, tuple[int, list[tuple[int, str]]]]:
    """Map each known `Label:` in a stage body to (its line, the lines of its content)."""
    fields: dict[str, tuple[int, list[tuple[int, str]]]] = {}
    current: str | None = None
    for line_no, text in body:
        heading = HEADING.match(text)
        m = None if heading else LABEL.match(text)
        label = (heading.group(2) if heading else m.group(1) if m else "").strip().lower()
        if label in KNOWN_LABELS:
            current = label
            rest = m.group(2) if m else ""
            fields[current] = (line_no, [(line_no, rest)] if rest.strip() else [])
        elif current is not None and text.strip():
            fields[current][1].append((line_no, text))
    return fields


def sequence_markers(text: str) -> list[int]:
    """The step numbers of a numbered list written inline or one per line: 1, 2, 3 ... in order.

    A number that does not continue the count ("... done by step 40. Then") is part of a step's
    sentence, not a marker, so only the markers 1, 2, ... that follow one another are kept.
    """
    steps: list[int] = []
    for n in (int(m) for m in INLINE_NUMBERED.findall(text)):
        if n == (steps[-1] + 1 if steps else 1) or (not steps and n == 0):
            steps.append(n)
    return steps


def count_items(content: list[tuple[int, str]]) -> int:
    """Count list items: one per bullet line, one per `N.` marker of the count elsewhere (`1. a 2. b` is two)."""
    bullets = sum(1 for _, t in content if BULLET.match(t))
    return bullets + len(sequence_markers(" ".join(t for _, t in content if not BULLET.match(t))))


class GuideChecker:
    """Collects the findings for one guide; one method per group of rules."""

    def __init__(self, path: str, text: str):
        self.path, self.lines = path, text.splitlines()
        self.findings: list[Finding] = []
        self.frontmatter: dict | None = None
        self.stages: dict[str, str] = {}
        self.sections: list[Section] = []

    def add(self, line: int, rule: str, message: str) -> None:
        """Record one finding."""
        self.findings.append(Finding(self.path, line, rule, message))

    def check(self, previous_path: str | None = None) -> list[Finding]:
        """Run every rule (and the growth rules when given the previous version), in line order."""
        if len(self.lines) >= MAX_LINES:
            self.add(len(self.lines), "TG-LINES", f"guide has {len(self.lines)} lines; keep it under "
                     f"{MAX_LINES} by replacing stale claims, not appending history")
        stages, body_start = self.check_frontmatter()
        sections = split_sections(self.lines, body_start)
        self.stages, self.sections = stages, sections
        self.check_sections(sections, stages)
        self.check_failure_lists()
        if previous_path:
            self.check_growth(previous_path)
        self.findings.sort(key=lambda f: f.line)
        return self.findings

    def read_summary(self) -> ReadSummary:
        """The stages read (with their frontmatter status) and the headings that are no stage entry."""
        names = [f"{name} ({status})" for name, status in self.stages.items()]
        ignored = {}
        for sec in self.sections:
            name = norm_name(sec.title)
            if name in self.stages and sec.level == 2:
                continue
            ignored[sec.title] = ("the title" if sec.level == 1 else "a capped list" if name in CAPS
                                  else "not a stage in the frontmatter")
        return ReadSummary(self.path, "markdown training guide", count_lines("\n".join(self.lines) + "\n"),
                           names, ignored, "stages")

    def check_frontmatter(self) -> tuple[dict[str, str], int]:
        """Frontmatter: present, parseable, exactly two keys, integer job, known statuses."""
        data, body_start, errors = parse_frontmatter(self.lines)
        for line, msg in errors:
            self.add(line, "TG-FM-SYNTAX", msg)
        if data is None:
            if not errors:
                self.add(1, "TG-FM-MISSING", "no frontmatter; start the file with '---', "
                         "last_reviewed_job and stages, then '---'")
            return {}, body_start
        self.frontmatter = data
        extra = sorted(set(data) - {"last_reviewed_job", "stages"})
        if extra:
            self.add(1, "TG-FM-KEYS", f"frontmatter may hold only last_reviewed_job and stages; "
                     f"remove: {', '.join(extra)}")
        job = data.get("last_reviewed_job")
        if "last_reviewed_job" not in data:
            self.add(1, "TG-FM-KEYS", "frontmatter lacks last_reviewed_job (use 0 before any job)")
        elif not isinstance(job, int) or job < 0:
            self.add(1, "TG-FM-JOB", f"last_reviewed_job must be a non-negative integer, got '{job}'")
        stages = data.get("stages")
        if "stages" not in data:
            self.add(1, "TG-FM-KEYS", "frontmatter lacks stages (a map of stage name -> status)")
            return {}, body_start
        if not isinstance(stages, dict) or not stages:
            self.add(1, "TG-FM-STAGES", "stages must be a non-empty map of stage name -> status")
            return {}, body_start
        result = {}
        for name, status in stages.items():
            status_text = str(status).strip().lower()
            if status_text not in STATUSES:
                self.add(1, "TG-FM-STATUS", f"stage '{name}' has status '{status}'; use one of "
                         f"{', '.join(STATUSES)}")
            result[norm_name(str(name))] = status_text
        return result, body_start

    def check_sections(self, sections: list[Section], stages: dict[str, str]) -> None:
        """Each stage has one `##` entry and each `##` entry is a stage or a capped list."""
        seen: set[str] = set()
        for sec in sections:
            name = norm_name(sec.title)
            if sec.level == 2 and name in stages:
                seen.add(name)
                self.check_stage(sec, stages[name])
            elif name in CAPS:
                self.check_cap(name, sec.line, sec.body)
            elif sec.level == 2 and stages and not FAILURE_CUES.search(sec.title):
                self.add(sec.line, "TG-STAGE-EXTRA", f"'## {sec.title}' is not a stage in the "
                         "frontmatter; add it to stages or fold it into a stage entry")
        for name in stages:
            if name not in seen:
                self.add(1, "TG-STAGE-MISSING", f"stage '{name}' is in the frontmatter but has no "
                         f"'## {name}' entry")

    def check_stage(self, sec: Section, fm_status: str) -> None:
        """The fields of one stage entry, its status, sequence, earliest link and capped lists."""
        fields = labelled_fields(sec.body)
        for label in REQUIRED_FIELDS:
            if label not in fields:
                self.add(sec.line, "TG-FIELD-MISSING", f"stage '{sec.title}' lacks '{label.capitalize()}:'")
            elif not "".join(t for _, t in fields[label][1]).strip() or all(
                    is_blank(t) and t.strip().lower().rstrip(".") != "none" for _, t in fields[label][1]):
                # In a guide "none" is an answer (no evidence missing), unlike in a table cell.
                self.add(fields[label][0], "TG-FIELD-EMPTY",
                         f"stage '{sec.title}': '{label.capitalize()}:' is empty")
        for label in CAPS:
            if label in fields:
                self.check_cap(label, fields[label][0], fields[label][1])
        steps = self.check_sequence(sec, fields)
        if "status" in fields:
            line, content = fields["status"]
            self.check_status(sec.title, line, " ".join(t.strip() for _, t in content), fm_status)
        if "earliest unsupported link" in fields and steps:
            line, content = fields["earliest unsupported link"]
            self.check_earliest(sec.title, line, " ".join(t for _, t in content), steps, fm_status)

    def check_sequence(self, sec: Section, fields: dict) -> list[int]:
        """Expected sequence is a numbered list of at least two observable steps."""
        if "expected sequence" not in fields:
            return []
        line, content = fields["expected sequence"]
        steps = sequence_markers(" ".join(t for _, t in content))
        if len(steps) < 2:
            self.add(line, "TG-SEQUENCE", f"stage '{sec.title}': Expected sequence must number its "
                     "steps in order (1. ... 2. ...)")
        return steps

    def check_status(self, stage: str, line: int, text: str, fm_status: str) -> None:
        """Status agrees with the frontmatter; unknown says only that; others carry a credence."""
        first = (re.findall(r"[a-z]+", text.lower()) or [""])[0]
        if fm_status == "unknown":
            if first != "unknown":
                self.add(line, "TG-STATUS-STATE", f"stage '{stage}' is unknown in the frontmatter but "
                         f"its Status begins '{first}'")
            elif find_credences(text) or re.search(r"\d\s*%", text) or HEDGES.search(text):
                hedge = HEDGES.search(text)
                said = f" (it says '{hedge.group(0)}', a credence without its word and number)" if hedge \
                    and not find_credences(text) else ""
                self.add(line, "TG-UNKNOWN-CLAIM", f"stage '{stage}' is unknown: its Status may say only "
                         f"that and what would fill it, with no credence{said}")
            elif len(re.findall(r"[A-Za-z0-9]+", text)) < 3:
                self.add(line, "TG-UNKNOWN-FILL", f"stage '{stage}': say what would fill the unknown "
                         "status, e.g. 'unknown; needs the zero-write arm'")
            return
        if fm_status in STATUSES and first != fm_status:
            self.add(line, "TG-STATUS-STATE", f"stage '{stage}': Status begins '{first}' but the "
                     f"frontmatter says '{fm_status}'")
        problem = check_credence_cell(text)
        if problem:
            self.add(line, "TG-STATUS-CREDENCE", f"stage '{stage}': {problem}")

    def check_earliest(self, stage: str, line: int, text: str, steps: list[int], status: str) -> None:
        """Earliest unsupported link names a step of the expected sequence (or none, if working)."""
        m = re.search(r"\b(?:step\s+)?(\d+)\b", text, re.IGNORECASE)
        if m and int(m.group(1)) in steps:
            return
        # "none, all three steps were seen in job 8": the job number is no step.
        if status == "working" and re.match(r"^\W*none\b", text, re.IGNORECASE):
            return
        self.add(line, "TG-EARLIEST", f"stage '{stage}': Earliest unsupported link must name a step "
                 f"of its expected sequence (steps {steps[0]}-{steps[-1]})")

    def check_cap(self, label: str, line: int, content: list[tuple[int, str]]) -> None:
        """Capped lists force replacing a stale line instead of appending a new one."""
        n, limit = count_items(content), CAPS[label]
        if n > limit:
            self.add(line, "TG-CAP", f"{n} {label}; the cap is {limit}, so replace a stale line "
                     "instead of adding one")

    def check_failure_lists(self) -> None:
        """No list of possible failure causes: a cue-word heading or lead-in followed by a list.

        A lead-in is a heading, a line ending in ':' or a bare `Label:`; a label followed by two or
        more comma- or semicolon-separated items on its own line is an inline list.
        """
        for i, text in enumerate(self.lines, 1):
            stripped = text.strip()
            label = LABEL.match(text)
            if stripped.startswith("#"):
                lead, inline = stripped, ""
            elif stripped.endswith(":"):
                lead, inline = stripped, ""
            elif label and label.group(1).strip().lower() not in KNOWN_LABELS:
                lead, inline = label.group(1), label.group(2)
            else:
                continue
            if not FAILURE_CUES.search(lead):
                continue
            following = next((t for t in self.lines[i:] if t.strip()), "")
            if LIST_ITEM.match(following) or len(re.findall(r"[,;]", inline)) >= 2:
                self.add(i, "TG-FAILURE-LIST", f"'{stripped[:60]}' introduces a list of possible failure "
                         "causes; the guide must not hold one: write the expected sequence and ask which "
                         "step ought to be observable by now")

    def check_growth(self, previous_path: str) -> None:
        """Against the previous version: no growth in lines, no step back in last_reviewed_job."""
        prev_lines = read_text(previous_path).splitlines()
        if len(self.lines) > len(prev_lines):
            self.add(len(self.lines), "TG-GREW", f"guide grew from {len(prev_lines)} to "
                     f"{len(self.lines)} lines; replace stale claims instead of appending history")
        prev, _, _ = parse_frontmatter(prev_lines)
        old_job = (prev or {}).get("last_reviewed_job")
        new_job = (self.frontmatter or {}).get("last_reviewed_job")
        if isinstance(old_job, int) and isinstance(new_job, int) and new_job < old_job:
            self.add(1, "TG-JOB-BACKWARDS", f"last_reviewed_job went back from {old_job} to {new_job}")


def main() -> int:
    """Parse arguments, check each guide, print the report and return the exit code."""
    parser = make_parser("check_training_guide.py", __doc__,
                         "Skeleton: ml-debug/assets/TRAINING_GUIDE.md. Exit 0 clean, 1 findings, "
                         "2 unreadable input.")
    parser.add_argument("files", nargs="+", metavar="TRAINING_GUIDE.md", help="guide(s) to check")
    parser.add_argument("--previous", metavar="OLD.md",
                        help="the guide before this edit; flags growth and a job number going back")
    args = parser.parse_args()
    if args.previous and len(args.files) != 1:
        raise InputError("--previous compares one guide; pass exactly one FILE")
    findings: list[Finding] = []
    reads = []
    for path in args.files:
        checker = GuideChecker(path, read_text(path))
        findings += checker.check(args.previous)
        reads.append(checker.read_summary())
    return report(TOOL, args.files, findings, args.json, reads=reads)


if __name__ == "__main__":
    run(TOOL, main)
