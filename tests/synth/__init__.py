"""Synthetic msprobe dumps of a tiny numpy Llama run in several engine layouts.

See README.md. Public API::

    from synth import Config, generate_pair, run_side, write_dump, parse_fault
    from synth import faults   # CorruptWeight, PermuteQKV, NormEps, ...
"""
from .faults import (FAULT_TYPES, Activation, CorruptWeight, ExtraOp, Fault, HalfPrecision,
                     KernelNoise, MissingActivation, NormEps, PermuteQKV, RopeTheta, parse_fault)
from .generate import generate_pair, run_side
from .layouts import LAYOUTS
from .model import Config, init_weights, make_tokens
from .record import Entry, Leaf
from .writer import leaf_stats, write_dump

__all__ = ["Config", "generate_pair", "run_side", "write_dump", "leaf_stats", "parse_fault",
           "LAYOUTS", "FAULT_TYPES", "Fault", "CorruptWeight", "PermuteQKV", "NormEps", "RopeTheta",
           "Activation", "MissingActivation", "ExtraOp", "HalfPrecision", "KernelNoise",
           "Entry", "Leaf", "init_weights", "make_tokens"]
