"""vLLM and SGLang Llama (``vllm/model_executor/models/llama.py``, ``sglang/srt/models/llama.py``).

Tokens are flattened (``[tokens, hidden]``) with separate ``positions``. Norms are fused
add+norm: from layer 1 on, ``input_layernorm(delta, residual)`` returns ``(normed, delta +
residual)``, and a decoder layer returns ``(mlp_delta, residual)``, not the full stream.
Parallel linears return ``(out, bias=None)``. q/k/v come from one fused weight ``[q; k; v]`` and
gate/up from ``[gate; up]``. vLLM computes logits in ``LogitsProcessor`` (called by the runner
with the lm_head module, whose own forward never runs) for every token; SGLang calls it inside
the model forward and returns only the last position's ``next_token_logits``.
Inference only: nothing requires grad.

Option ``pad_vocab``: embedding and lm_head rows padded with zeros to a multiple of 64, logits
trimmed back to the real vocabulary (``org_vocab_size``).
"""
import numpy as np

from .common import Side, extra_op, pad_rows

ACT_CLASSES = {"silu": "SiluAndMul", "gelu_tanh": "GeluAndMul", "relu": "ReluAndMul"}
VOCAB_PADDING = 64


class _Engine:
    """One forward pass of the inference engine's LlamaForCausalLM."""

    def __init__(self, s: Side):
        self.s = s
        pad = VOCAB_PADDING if s.options.get("pad_vocab", False) else 1
        self.embed = pad_rows(s.plan.weights.embed, pad)
        self.lm_head = pad_rows(s.plan.weights.lm_head, pad)

    def parallel_linear(self, path: str, cls: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        with self.s.rec.module(path, cls, args=[x], params={"weight": w}) as m:
            return m.returns((self.s.k.linear(x, w), None))[0]

    def norm(self, path: str, x: np.ndarray, residual, w: np.ndarray, eps: float):
        """RMSNorm; with a residual it is the fused add+norm returning ``(normed, x + residual)``."""
        k = self.s.k
        args = [x] if residual is None else [x, residual]
        with self.s.rec.module(path, "RMSNorm", args=args, params={"weight": w}) as m:
            if residual is None:
                return m.returns(k.rms_norm(x, w, eps)), x
            stream = k.add(x, residual)
            return m.returns((k.rms_norm(stream, w, eps), stream))

    def run(self) -> None:
        s = self.s
        hidden = self.model("model")
        with s.k.bf16_scope(s.plan.lm_head_bf16):
            self.logits(hidden)

    def model_args(self) -> list:
        """(input_ids, positions, intermediate_tensors, inputs_embeds)."""
        return [self.s.ids, self.s.positions, None, None]

    def model(self, path: str) -> np.ndarray:
        s = self.s
        with s.rec.module(path, "LlamaModel", args=self.model_args()) as m:
            with s.rec.module(f"{path}.embed_tokens", "VocabParallelEmbedding", args=[s.ids],
                              params={"weight": self.embed}) as e:
                x = e.returns(s.k.embed(s.ids, self.embed))
            residual = None
            for i in range(s.cfg.layers):
                x, residual = self.layer(f"{path}.layers.{i}", i, x, residual)
            normed, _ = self.norm(f"{path}.norm", x, residual, s.plan.weights.final_norm,
                                  s.plan.eps(None))
            return m.returns(normed)

    def layer(self, path: str, i: int, x, residual):
        s, lw = self.s, self.s.plan.weights.layers[i]
        with s.rec.module(path, "LlamaDecoderLayer", args=self.layer_args(x, residual)) as dl:
            h, residual = self.norm(f"{path}.input_layernorm", x, residual, lw.input_norm,
                                    s.plan.eps(i))
            attn_kwargs = {"positions": s.positions, "hidden_states": h, **self.batch_kwarg()}
            with s.rec.module(f"{path}.self_attn", "LlamaAttention", kwargs=attn_kwargs) as at:
                a = at.returns(self.attention(f"{path}.self_attn", i, h))
            h, residual = self.norm(f"{path}.post_attention_layernorm", a, residual, lw.post_norm,
                                    s.plan.eps(i))
            with s.rec.module(f"{path}.mlp", "LlamaMLP", args=[h]) as mm:
                y = mm.returns(self.mlp(f"{path}.mlp", i, h))
            return dl.returns((y, residual))

    def layer_args(self, x, residual) -> list:
        return [self.s.positions, x, residual]

    def batch_kwarg(self) -> dict:
        return {}

    def attention(self, path: str, i: int, h) -> np.ndarray:
        s, cfg, lw = self.s, self.s.cfg, self.s.plan.weights.layers[i]
        w = s.plan.fuse_qkv(i, [("q", lw.q), ("k", lw.k), ("v", lw.v)])
        qkv = self.parallel_linear(f"{path}.qkv_proj", "QKVParallelLinear", h, w)
        q, k, v = np.split(qkv, [cfg.q_size, cfg.q_size + cfg.kv_size], axis=-1)
        t, hd = cfg.seq_len, cfg.head_dim
        with s.rec.module(f"{path}.rotary_emb", "RotaryEmbedding", args=[s.positions, q, k]) as r:
            cos, sin = s.k.rope_cos_sin(s.angles())
            q = s.k.rope(q.reshape(t, cfg.heads, hd), cos, sin).reshape(t, -1)
            k = s.k.rope(k.reshape(t, cfg.kv_heads, hd), cos, sin).reshape(t, -1)
            r.returns((q, k))
        with s.rec.module(f"{path}.attn", self.attn_class(), args=self.attn_args(q, k, v)) as at:
            o, _ = s.k.attention(q.reshape(t, cfg.heads, hd), k.reshape(t, cfg.kv_heads, hd),
                                 v.reshape(t, cfg.kv_heads, hd))
            at.returns(o)
        return self.parallel_linear(f"{path}.o_proj", "RowParallelLinear", o, lw.o)

    def attn_class(self) -> str:
        return "Attention"

    def attn_args(self, q, k, v) -> list:
        return [q, k, v]

    def mlp(self, path: str, i: int, h) -> np.ndarray:
        s, cfg, lw = self.s, self.s.cfg, self.s.plan.weights.layers[i]
        w = np.concatenate([lw.gate, lw.up], axis=0)
        gate_up = self.parallel_linear(f"{path}.gate_up_proj", "MergedColumnParallelLinear", h, w)
        gate, up = np.split(gate_up, [cfg.intermediate], axis=-1)
        act = s.plan.acts[i]
        if act is None:
            hidden = s.k.mul(gate, up)
        else:
            with s.rec.module(f"{path}.act_fn", ACT_CLASSES[act], args=[gate_up]) as m:
                hidden = m.returns(s.k.mul(s.k.act(act, gate), up))
        hidden = extra_op(s, i, path, hidden)
        return self.parallel_linear(f"{path}.down_proj", "RowParallelLinear", hidden, lw.down)

    def logits(self, hidden: np.ndarray) -> None:
        """vLLM: ``logits_processor(lm_head, hidden)`` over all tokens, trimmed to the vocab."""
        s = self.s
        with s.rec.module("logits_processor", "LogitsProcessor", args=[None, hidden]) as m:
            m.returns(s.k.linear(hidden, self.lm_head)[:, :s.cfg.vocab])


class _SGLang(_Engine):
    """SGLang differences: ForwardBatch arguments, RadixAttention, last-position logits object."""

    def model_args(self) -> list:
        return [self.s.ids, self.s.positions, None, None, None]

    def layer_args(self, x, residual) -> list:
        return [self.s.positions, x, None, residual]

    def batch_kwarg(self) -> dict:
        return {"forward_batch": None}

    def attn_class(self) -> str:
        return "RadixAttention"

    def attn_args(self, q, k, v) -> list:
        return [q, k, v, None]

    def logits(self, hidden: np.ndarray) -> None:
        s = self.s
        with s.rec.module("logits_processor", "LogitsProcessor",
                          args=[s.ids, hidden, None, None]) as m:
            last = s.k.linear(hidden[-1:], self.lm_head)[:, :s.cfg.vocab]
            m.returns({"next_token_logits": last, "hidden_states": None,
                       "next_token_logprobs": None, "next_token_top_logprobs_val": None,
                       "next_token_top_logprobs_idx": None, "input_token_logprobs": None,
                       "input_top_logprobs_val": None, "input_top_logprobs_idx": None})


def run_vllm(s: Side) -> None:
    """vLLM LlamaForCausalLM forward plus the runner's ``compute_logits``."""
    _Engine(s).run()


def run_sglang(s: Side) -> None:
    """SGLang LlamaForCausalLM forward (logits processor inside the model forward)."""
    _SGLang(s).run()
