"""A numpy reference forward of a Hugging Face checkpoint (issue 17): the third side.

``forward`` runs the checkpoint's own math for the dumped tokens and yields every standard
module's output, streaming weights one module at a time from the memory-mapped safetensors;
``Injection`` re-runs it with a candidate fault. Families, bf16 rounding and limits:
references/reference_forward.md.
"""
from .engine import Injection, Output, final_logits, forward
from .spec import UnsupportedModel, family

__all__ = ["Injection", "Output", "UnsupportedModel", "family", "final_logits", "forward"]
