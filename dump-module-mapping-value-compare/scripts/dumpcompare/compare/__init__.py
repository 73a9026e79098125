"""The comparison step: the executor (executor.py) runs the planned comparisons (output_2
``comparisons``) into result records (output_3). This file only names what callers use."""
from .executor import Executor, Result, SideView, leaf_stats, n_calls
from .leafindex import EntryLeaves

__all__ = ["EntryLeaves", "Executor", "Result", "SideView", "leaf_stats", "n_calls"]
