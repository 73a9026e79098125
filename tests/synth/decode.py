"""Turn one full-sequence vLLM/SGLang forward into a prefill call and single-token decode calls.

With a KV cache each token's activations are the same whether it is computed in the prefill or
in a later decode step (attention is causal), so slicing the full forward along the tokens gives
exactly what an engine dumps for ``forward.0`` (prefill) and ``forward.1..n`` (decode steps).
"""
import copy

from .record import Leaf


def _slice(item, lo: int, hi: int, tokens: int):
    if isinstance(item, Leaf):
        if item.data.ndim and item.data.shape[0] == tokens:
            return Leaf(item.data[lo:hi].copy(), item.dtype, item.requires_grad)
        return item
    if isinstance(item, list):
        return [_slice(x, lo, hi, tokens) for x in item]
    if isinstance(item, dict) and "type" not in item:
        return {k: _slice(v, lo, hi, tokens) for k, v in item.items()}
    return item


def _call(key: str, n: int) -> str:
    return key.rsplit(".", 1)[0] + f".{n}" if key else key


def split_prefill_decode(entries: list, tokens: int, prefill: int) -> list:
    """Entries of a prefill over ``prefill`` tokens followed by one decode call per later token."""
    out = []
    ranges = [(0, prefill)] + [(t, t + 1) for t in range(prefill, tokens)]
    for n, (lo, hi) in enumerate(ranges):
        for e in entries:
            c = copy.copy(e)
            c.key, c.parent = _call(e.key, n), _call(e.parent, n) if e.parent else None
            c.input_args = _slice(e.input_args, lo, hi, tokens)
            c.input_kwargs = _slice(e.input_kwargs, lo, hi, tokens)
            c.output = _slice(e.output, lo, hi, tokens)
            out.append(c)
    return out
