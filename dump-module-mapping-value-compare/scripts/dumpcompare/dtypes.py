"""Dtype names: the one spelling of a dumped dtype and the one test for an integer dtype.

Standard library only and no package imports: the root-cause skill loads this file by path
from its sibling folder (rootcause/sibling.py), as it does safetext.py.
"""
from __future__ import annotations

from functools import lru_cache

# The floating dtypes from the most precise to the least (by mantissa bits: bfloat16 keeps 8,
# float16 11); published in output_4 ``vocabulary.dtype_precision`` so that a reader ranks sides
# by it instead of its own list. A dtype not listed ranks below every listed one.
PRECISION = ("float64", "float32", "float16", "bfloat16")


# Asked a few times per comparison of every leaf (21k comparisons of a dump of many modules asked
# 190k times) about a handful of distinct names: remembered, bounded against hostile dumps.
@lru_cache(maxsize=1024)
def dtype_key(dtype: str | None) -> str:
    """'torch.bfloat16' -> 'bfloat16'; integer and unknown dtypes map to their own names."""
    if not dtype:
        return "default"
    d = dtype.replace("torch.", "").lower()
    return {"float": "float32", "half": "float16", "double": "float64", "bf16": "bfloat16"}.get(d, d)


@lru_cache(maxsize=1024)
def is_int_dtype(dtype: str | None) -> bool:
    """True for integer and boolean dtypes (their statistics compare exactly)."""
    d = dtype_key(dtype)
    return d.startswith(("int", "uint", "bool", "long"))
