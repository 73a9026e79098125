"""Offline dumpers of the two sides: vLLM with msprobe inside its worker, and the trainer's
log-prob forward in transformers.

Modules:
    cli                 shared command-line plumbing: input errors, the missing-package message, dtypes
    token_ids           prompt ids as users hold them; ``tokens.json`` read and written
    logprob_jsonl       the generic log-prob JSONL (one record per sequence) written by both dumpers
    msprobe_config      the msprobe config file both dumpers hand to ``PrecisionDebugger``
    vllm_worker_ext     the vLLM worker extension (``start_dump``/``stop_dump``) and the same as
                        functions for engines built by a framework
"""
