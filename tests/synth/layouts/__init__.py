"""Engine layouts: the same model written in each engine's module tree and execution order.

``LAYOUTS`` maps a layout name to a function ``run(side)`` that performs the forward pass of one
side, recording every module call on ``side.rec``. Per-layout options (``side.options``) are
listed in each module's docstring.
"""
from .hf import run_hf, run_hf_fsdp
from .megatron import run_megatron, run_megatron_local
from .vllm import run_sglang, run_vllm

LAYOUTS = {
    "hf": run_hf,
    "hf_fsdp": run_hf_fsdp,
    "vllm": run_vllm,
    "sglang": run_sglang,
    "megatron": run_megatron,
    "megatron_local": run_megatron_local,
}
