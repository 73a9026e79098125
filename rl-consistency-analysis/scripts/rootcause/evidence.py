"""Read the sibling's documented outputs (output_2..4 JSON) into plain lookups."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_MAJOR = "1"


class EvidenceError(Exception):
    """An output file is missing, unreadable or of an unsupported schema version."""


def _read(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EvidenceError(f"{path}: missing (the compare step did not write it)") from None
    except (OSError, ValueError) as exc:
        raise EvidenceError(f"{path}: unreadable ({exc})") from None
    ver = str(doc.get("schema_version", ""))
    if ver.split(".")[0] != SUPPORTED_MAJOR:
        raise EvidenceError(f"{path}: schema_version {ver!r} is not supported (need {SUPPORTED_MAJOR}.x)")
    return doc


@dataclass
class Evidence:
    """Everything the triage reads, indexed for lookups."""
    mapping: dict
    compare: dict
    analysis: dict
    modules: list[dict] = field(default_factory=list)
    pos: dict[str, int] = field(default_factory=dict)          # pair id -> position in train order
    results: dict[str, dict] = field(default_factory=dict)     # cid -> output_3 result
    one_sided: list[dict] = field(default_factory=list)        # output_2 one-sided (with reasons)

    @property
    def mode(self) -> str:
        return self.compare.get("mode", "statistics")


def load(out_dir: Path) -> Evidence:
    """Load output_2, output_3 and output_4 from ``out_dir``."""
    ev = Evidence(_read(out_dir / "output_2_mapping.json"), _read(out_dir / "output_3_value_compare.json"),
                  _read(out_dir / "output_4_module_analysis.json"))
    ev.modules = ev.analysis.get("modules", [])
    ev.pos = {m["pid"]: i for i, m in enumerate(ev.modules)}
    ev.results = {r["cid"]: r for r in ev.compare.get("results", [])}
    status_by_key = {(o["side"], o["module"], o["index"]): o for o in ev.analysis.get("one_sided", [])}
    for o in ev.mapping.get("one_sided", []):
        merged = dict(o)
        merged["point_status"] = status_by_key.get((o["side"], o["module"], o["index"]), {}).get("points", {})
        ev.one_sided.append(merged)
    return ev
