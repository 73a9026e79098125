"""Megatron-core GPTModel, Transformer-Engine spec (``megatron``) or local spec (``megatron_local``).

Sequence-first activations (``[tokens, 1, hidden]``; the word embedding itself is still
``[1, tokens, hidden]`` and LanguageModelEmbedding transposes it). Linears return
``(out, bias=None)``; so do SelfAttention and MLP, and a TransformerLayer returns
``(hidden, context=None)`` where hidden is the full residual stream.

TE spec: the attention and MLP norms are fused into ``linear_qkv``/``linear_fc1``
(``TELayerNormColumnParallelLinear``, parameters ``layer_norm_weight`` and ``weight``), so
``input_layernorm``/``pre_mlp_layernorm`` are ``IdentityOp``; the final norm is a ``TENorm``,
whose ``__new__`` returns Transformer-Engine's ``RMSNorm``, so that is the class in the dump.
Local spec: real ``WrappedTorchNorm`` norm modules and plain parallel linears.

``linear_qkv.weight`` is grouped per KV head: for each group g, that group's q heads, then k_g,
then v_g. The activation is computed inside ``MLP.forward`` (no module). RoPE is applied by a
function inside SelfAttention; ``rotary_pos_emb`` outputs the angle table ``[tokens, 1, 1, hd]``.

Options: ``prefix`` (``""``, ``"module."`` for DDP, ``"module.module."`` for DDP +
Float16Module, which then appear as GPTModel / Float16Module entries), ``pad_vocab`` (vocab rows
padded with zeros to a multiple of 128; the logits keep the padded columns, as Megatron's do).
"""
import numpy as np

from ..kernels import F32_NAME
from ..record import Leaf
from .common import Side, extra_op, gated_act, pad_rows

VOCAB_PADDING = 128
PREFIXES = ("", "module.", "module.module.")
TE_CLASSES = {"qkv": "TELayerNormColumnParallelLinear", "fc1": "TELayerNormColumnParallelLinear",
              "proj": "TERowParallelLinear", "fc2": "TERowParallelLinear",
              "core": "TEDotProductAttention", "final": "RMSNorm"}
LOCAL_CLASSES = {"qkv": "ColumnParallelLinear", "fc1": "ColumnParallelLinear",
                 "proj": "RowParallelLinear", "fc2": "RowParallelLinear",
                 "core": "DotProductAttention", "final": "WrappedTorchNorm"}


def grouped_qkv_segments(cfg, lw) -> list:
    """``(role, rows)`` of the fused qkv weight in Megatron's per-query-group order."""
    hd, rep = cfg.head_dim, cfg.heads // cfg.kv_heads
    segments = []
    for g in range(cfg.kv_heads):
        segments += [("q", lw.q[g * rep * hd:(g + 1) * rep * hd]),
                     ("k", lw.k[g * hd:(g + 1) * hd]), ("v", lw.v[g * hd:(g + 1) * hd])]
    return segments


class _Megatron:
    """One forward pass of GPTModel (and its DDP / Float16Module wrappers)."""

    def __init__(self, s: Side, te: bool):
        self.s = s
        self.te = te
        self.cls = TE_CLASSES if te else LOCAL_CLASSES
        self.prefix = s.options.get("prefix", "")
        if self.prefix not in PREFIXES:
            raise ValueError(f"megatron prefix must be one of {PREFIXES}, got {self.prefix!r}")
        pad = VOCAB_PADDING if s.options.get("pad_vocab", False) else 1
        self.embed = pad_rows(s.plan.weights.embed, pad)
        self.output = pad_rows(s.plan.weights.lm_head, pad)
        self.freqs = None

    def linear(self, path: str, role: str, x, w, norm_w=None, eps=None) -> np.ndarray:
        """A parallel linear returning (out, None); with ``norm_w`` the TE norm is fused inside."""
        k = self.s.k
        params = {"weight": w} if norm_w is None else {"layer_norm_weight": norm_w, "weight": w}
        with self.s.rec.module(path, self.cls[role], args=[x], params=params) as m:
            normed = x if norm_w is None else k.rms_norm(x, norm_w, eps)
            return m.returns((k.linear(normed, w), None))[0]

    def norm(self, path: str, x, w, eps: float, cls: str) -> np.ndarray:
        with self.s.rec.module(path, cls, args=[x], params={"weight": w}) as m:
            return m.returns(self.s.k.rms_norm(x, w, eps))

    def layer_norm(self, path: str, x, w, eps):
        """A layer's own norm module: IdentityOp under TE (the norm is fused downstream)."""
        if self.te:
            with self.s.rec.module(path, "IdentityOp", args=[x]) as m:
                return m.returns(x)
        return self.norm(path, x, w, eps, "WrappedTorchNorm")

    def run(self) -> None:
        s = self.s
        ids, pos = s.ids[None], s.positions[None]
        kwargs = {"input_ids": ids, "position_ids": pos, "attention_mask": None}
        p = self.prefix
        with s.rec.module("module", "Float16Module", kwargs=kwargs,
                          enabled=p == "module.module.") as f16, \
                s.rec.module(p[:-1], "GPTModel", kwargs=kwargs, enabled=bool(p)) as gpt:
            logits = self.gpt(p, ids, pos)
            out = gpt.returns(np.ascontiguousarray(logits.transpose(1, 0, 2)))
            # Float16Module hands the last stage's output back in float32.
            f16.returns(Leaf(out, F32_NAME, s.rec.grad))

    def gpt(self, p: str, ids, pos) -> np.ndarray:
        s = self.s
        with s.rec.module(f"{p}embedding", "LanguageModelEmbedding",
                          kwargs={"input_ids": ids, "position_ids": pos}) as emb:
            with s.rec.module(f"{p}embedding.word_embeddings", "VocabParallelEmbedding", args=[ids],
                              params={"weight": self.embed}) as we:
                x = we.returns(s.k.embed(ids, self.embed))
            x = emb.returns(np.ascontiguousarray(x.transpose(1, 0, 2)))
        with s.rec.module(f"{p}rotary_pos_emb", "RotaryEmbedding", args=[s.cfg.seq_len],
                          kwargs={"packed_seq": False}) as r:
            # The angle table is built in float32 whatever the model dtype.
            self.freqs = Leaf(s.angles()[:, None, None, :], F32_NAME, False)
            r.returns(self.freqs)
        block_kwargs = {"hidden_states": x, "attention_mask": None, "inference_context": None,
                        "rotary_pos_emb": self.freqs, "rotary_pos_cos": None,
                        "rotary_pos_sin": None, "packed_seq_params": None,
                        "sequence_len_offset": None}
        with s.rec.module(f"{p}decoder", "TransformerBlock", kwargs=block_kwargs) as blk:
            for i in range(s.cfg.layers):
                x = self.layer(f"{p}decoder.layers.{i}", i, x)
            x = blk.returns(self.norm(f"{p}decoder.final_layernorm", x, s.plan.weights.final_norm,
                                      s.plan.eps(None), self.cls["final"]))
        with s.k.bf16_scope(s.plan.lm_head_bf16):
            with s.rec.module(f"{p}output_layer", "ColumnParallelLinear", args=[x],
                              kwargs={"weight": None, "runtime_gather_output": None},
                              params={"weight": self.output}) as out:
                return out.returns((s.k.linear(x, self.output), None))[0]

    def layer(self, path: str, i: int, x) -> np.ndarray:
        s, lw = self.s, self.s.plan.weights.layers[i]
        eps = s.plan.eps(i)
        kwargs = {"hidden_states": x, "attention_mask": None, "context": None, "context_mask": None,
                  "rotary_pos_emb": self.freqs, "rotary_pos_cos": None, "rotary_pos_sin": None,
                  "attention_bias": None, "inference_context": None, "packed_seq_params": None,
                  "sequence_len_offset": None}
        with s.rec.module(path, "TransformerLayer", kwargs=kwargs) as tl:
            h = self.layer_norm(f"{path}.input_layernorm", x, lw.input_norm, eps)
            attn_kwargs = {"attention_mask": None, "inference_context": None,
                           "rotary_pos_emb": self.freqs, "rotary_pos_cos": None,
                           "rotary_pos_sin": None, "attention_bias": None,
                           "packed_seq_params": None, "sequence_len_offset": None}
            with s.rec.module(f"{path}.self_attention", "SelfAttention", args=[h],
                              kwargs=attn_kwargs) as sa:
                y = sa.returns((self.attention(f"{path}.self_attention", i, h), None))[0]
            x = s.k.add(x, y)
            h = self.layer_norm(f"{path}.pre_mlp_layernorm", x, lw.post_norm, eps)
            with s.rec.module(f"{path}.mlp", "MLP", args=[h]) as mm:
                y = mm.returns((self.mlp(f"{path}.mlp", i, h), None))[0]
            x = s.k.add(x, y)
            return tl.returns((x, None))[0]

    def attention(self, path: str, i: int, h) -> np.ndarray:
        s, cfg, lw = self.s, self.s.cfg, self.s.plan.weights.layers[i]
        t, hd, rep = cfg.seq_len, cfg.head_dim, cfg.heads // cfg.kv_heads
        w = s.plan.fuse_qkv(i, grouped_qkv_segments(cfg, lw))
        fused_norm = lw.input_norm if self.te else None
        qkv = self.linear(f"{path}.linear_qkv", "qkv", h, w, fused_norm, s.plan.eps(i))
        groups = qkv.reshape(t, 1, cfg.kv_heads, (rep + 2) * hd)
        q = groups[..., :rep * hd].reshape(t, cfg.heads, hd)
        k = groups[..., rep * hd:(rep + 1) * hd].reshape(t, cfg.kv_heads, hd)
        v = groups[..., (rep + 1) * hd:].reshape(t, cfg.kv_heads, hd)
        cos, sin = s.k.rope_cos_sin(s.angles())
        q, k = s.k.rope(q, cos, sin)[:, None], s.k.rope(k, cos, sin)[:, None]
        v = v[:, None]
        with s.rec.module(f"{path}.core_attention", self.cls["core"], args=[q, k, v, None],
                          kwargs={"attn_mask_type": None, "attention_bias": None,
                                  "packed_seq_params": None}) as ca:
            o, _ = s.k.attention(q[:, 0], k[:, 0], v[:, 0])
            o = ca.returns(o[:, None])
        return self.linear(f"{path}.linear_proj", "proj", o, lw.o)

    def mlp(self, path: str, i: int, h) -> np.ndarray:
        s, lw = self.s, self.s.plan.weights.layers[i]
        w = np.concatenate([lw.gate, lw.up], axis=0)
        fused_norm = lw.post_norm if self.te else None
        fc1 = self.linear(f"{path}.linear_fc1", "fc1", h, w, fused_norm, s.plan.eps(i))
        gate, up = np.split(fc1, 2, axis=-1)
        hidden = extra_op(s, i, path, gated_act(s, i, gate, up))
        return self.linear(f"{path}.linear_fc2", "fc2", hidden, lw.down)


def run_megatron(s: Side) -> None:
    """Megatron-core GPTModel with the Transformer-Engine layer spec."""
    _Megatron(s, te=True).run()


def run_megatron_local(s: Side) -> None:
    """Megatron-core GPTModel with the local (non-TE) layer spec."""
    _Megatron(s, te=False).run()
