"""Why a comparison did not happen: one typed record and one list of codes for the whole skill.

Readers (this skill's own documents and the root-cause skill) decide by ``code``; ``reason`` is
the prose for people and may change wording at any time. The list is published, with a line per
code, in references/output_schemas.md ("Skip codes"); a test keeps the two equal.
"""
from __future__ import annotations

from dataclasses import dataclass

SKIP_CODES = (
    # value comparisons (output_3 results)
    "missing_leaf", "dtype_conflict", "extra_token", "partial_sums", "tp_shard", "padded_vocab",
    "shape_conflict", "no_statistics", "tensor_unavailable",
    # shared by value comparisons and the attention replay
    "layout",
    # the attention replay (output_4 replays)
    "no_config", "missing_tensor", "too_large", "rope_scaling", "positions_unknown", "earlier_kv_missing",
    # the reference forward (output_3 reference_forward and its sides)
    "family_unsupported", "token_ids_unknown", "token_beyond_vocab", "forward_unsupported", "no_side",
)


@dataclass(frozen=True)
class Skip:
    """Why something was not compared: ``code`` from SKIP_CODES, ``reason`` for people."""
    code: str
    reason: str

    def __post_init__(self):
        if self.code not in SKIP_CODES:
            raise TypeError(f"unknown skip code {self.code!r}")
