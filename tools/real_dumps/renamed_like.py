"""An engine-style re-creation of GPT-NeoX whose module tree no naming profile describes.

The computation is transformers' GPTNeoXForCausalLM (parallel residual, fused query_key_value
laid out per head as [q; k; v], partial rotary, exact GELU), laid out the way a serving engine
lays a model out, with its own names: tokens flattened to ``[num_tokens, hidden]``, a wrapper
prefix (``backbone``), renamed modules, the rotary embedding and the attention kernel as modules of
their own (as vLLM and SGLang have them), and the MLP's first linear fused with its activation
(``LinearGelu``: one module where transformers has ``dense_h_to_4h`` then ``act``). It exists to
test mapping by values (dumpcompare/value_align.py) on real dumps; no engine ships these names.

Public API:
    build(hf_config, dtype=torch.float32) -> EngineNeoX
    model.load_weights(hf_state_dict)       transformers names -> this tree's names
    model(input_ids, positions) -> hidden   one engine forward (1-D token ids and positions)
    model.compute_logits(hidden) -> logits  ``head`` on the rows given
    model.reset_cache()                     nothing to reset: the tree runs prefill only
    hf_names(layers) -> dict                this tree's module -> the transformers module whose
                                            output it carries (a fused module: the last one it fuses)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# (this tree, transformers) module names; "{N}" is the layer index.
_RENAMES = (
    ("backbone.tok_embed", "gpt_neox.embed_in"),
    ("backbone.blocks.{N}.ln_attn", "gpt_neox.layers.{N}.input_layernorm"),
    ("backbone.blocks.{N}.mixer.wqkv", "gpt_neox.layers.{N}.attention.query_key_value"),
    ("backbone.blocks.{N}.mixer.proj", "gpt_neox.layers.{N}.attention.dense"),
    ("backbone.blocks.{N}.mixer", "gpt_neox.layers.{N}.attention"),
    ("backbone.blocks.{N}.ln_mlp", "gpt_neox.layers.{N}.post_attention_layernorm"),
    ("backbone.blocks.{N}.ffn.fc_in", "gpt_neox.layers.{N}.mlp.act"),
    ("backbone.blocks.{N}.ffn.fc_out", "gpt_neox.layers.{N}.mlp.dense_4h_to_h"),
    ("backbone.blocks.{N}.ffn", "gpt_neox.layers.{N}.mlp"),
    ("backbone.blocks.{N}", "gpt_neox.layers.{N}"),
    ("backbone.ln_out", "gpt_neox.final_layer_norm"),
    ("head", "lm_head"),
)
# Parameters of fused modules come from the module they fuse, not the one they stand for.
_WEIGHTS_FROM = {"backbone.blocks.{N}.ffn.fc_in": "gpt_neox.layers.{N}.mlp.dense_h_to_4h"}


def hf_names(layers: int) -> dict[str, str]:
    out = {}
    for ours, theirs in _RENAMES:
        for n in (range(layers) if "{N}" in ours else [None]):
            out[ours.replace("{N}", str(n))] = theirs.replace("{N}", str(n))
    return out



class LinearGelu(nn.Linear):
    """A linear layer with the exact GELU fused after it (one module, one output)."""

    def forward(self, x):
        return F.gelu(super().forward(x))


class Rope(nn.Module):
    """Rotary embedding of the first ``rotary_dim`` features of each head, from the positions."""

    def __init__(self, head_dim, rotary_dim, theta):
        super().__init__()
        self.head_dim, self.rotary_dim, self.theta = head_dim, rotary_dim, theta

    def forward(self, positions, q, k):
        inv = 1.0 / (self.theta ** (torch.arange(0, self.rotary_dim, 2, dtype=torch.float32) / self.rotary_dim))
        freqs = positions.float()[:, None] * inv[None]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x, cos, sin):
        shape = x.shape
        x = x.view(shape[0], -1, self.head_dim)
        rot, rest = x[..., :self.rotary_dim], x[..., self.rotary_dim:]
        half = self.rotary_dim // 2
        turned = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
        rot = (rot * cos.to(x.dtype)) + (turned * sin.to(x.dtype))
        return torch.cat([rot, rest], dim=-1).reshape(shape)


class Core(nn.Module):
    """Causal softmax attention over flattened tokens (q, k, v: [tokens, heads * head_dim])."""

    def __init__(self, heads, head_dim):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim

    def forward(self, q, k, v):
        s = q.shape[0]
        q, k, v = (t.view(s, self.heads, self.head_dim).transpose(0, 1) for t in (q, k, v))
        scores = (q @ k.transpose(1, 2)) / math.sqrt(self.head_dim)
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        probs = scores.masked_fill(mask, float("-inf")).softmax(-1, dtype=torch.float32).to(q.dtype)
        return (probs @ v).transpose(0, 1).reshape(s, -1)


class Mixer(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        h, heads = cfg.hidden_size, cfg.num_attention_heads
        self.heads, self.head_dim = heads, h // heads
        rotary = int(self.head_dim * cfg.rope_parameters.get("partial_rotary_factor", 1.0))
        self.wqkv = nn.Linear(h, 3 * h, bias=cfg.attention_bias, dtype=dtype)
        self.rope = Rope(self.head_dim, rotary, cfg.rope_parameters["rope_theta"])
        self.core = Core(heads, self.head_dim)
        self.proj = nn.Linear(h, h, bias=cfg.attention_bias, dtype=dtype)

    def forward(self, x, positions):
        s = x.shape[0]
        qkv = self.wqkv(x).view(s, self.heads, 3 * self.head_dim)
        q, k, v = (t.reshape(s, -1) for t in qkv.chunk(3, dim=-1))
        q, k = self.rope(positions, q, k)
        return self.proj(self.core(q, k, v))


class FFN(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        self.fc_in = LinearGelu(cfg.hidden_size, cfg.intermediate_size, dtype=dtype)
        self.fc_out = nn.Linear(cfg.intermediate_size, cfg.hidden_size, dtype=dtype)

    def forward(self, x):
        return self.fc_out(self.fc_in(x))


class Block(nn.Module):
    """GPT-NeoX's parallel residual: x + attention(norm1(x)) + mlp(norm2(x))."""

    def __init__(self, cfg, dtype):
        super().__init__()
        eps = cfg.layer_norm_eps
        self.ln_attn = nn.LayerNorm(cfg.hidden_size, eps=eps, dtype=dtype)
        self.mixer = Mixer(cfg, dtype)
        self.ln_mlp = nn.LayerNorm(cfg.hidden_size, eps=eps, dtype=dtype)
        self.ffn = FFN(cfg, dtype)

    def forward(self, x, positions):
        return x + self.mixer(self.ln_attn(x), positions) + self.ffn(self.ln_mlp(x))


class Backbone(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.blocks = nn.ModuleList(Block(cfg, dtype) for _ in range(cfg.num_hidden_layers))
        self.ln_out = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, dtype=dtype)

    def forward(self, ids, positions):
        x = self.tok_embed(ids)
        for block in self.blocks:
            x = block(x, positions)
        return self.ln_out(x)


class EngineNeoX(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        self.backbone = Backbone(cfg, dtype)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype)
        self.layers = cfg.num_hidden_layers

    def forward(self, ids, positions):
        return self.backbone(ids, positions)

    def compute_logits(self, hidden):
        return self.head(hidden)

    def reset_cache(self):
        pass

    @torch.no_grad()
    def load_weights(self, state):
        names = hf_names(self.layers)
        sources = {ours: _source(ours, theirs) for ours, theirs in names.items()}
        for pname, p in self.named_parameters():
            module, leaf = pname.rsplit(".", 1)
            p.copy_(state[f"{sources[module]}.{leaf}"].to(p.dtype))


def _source(ours: str, theirs: str) -> str:
    for pattern, source in _WEIGHTS_FROM.items():
        layer = theirs.split(".")[2] if ".layers." in theirs else ""
        if pattern.replace("{N}", layer) == ours:
            return source.replace("{N}", layer)
    return theirs


def build(hf_config, dtype=torch.float32) -> EngineNeoX:
    """The engine-style model for ``hf_config`` (a GPTNeoXConfig) in ``dtype``."""
    return EngineNeoX(hf_config, dtype).eval()
