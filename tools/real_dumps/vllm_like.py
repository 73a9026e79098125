"""PyTorch re-creations of vLLM's module trees (Llama family), tensor-parallel over gloo.

Each class is named, nested and called as vLLM names, nests and calls it, so that msprobe's L0 dump
of it carries vLLM's module paths, class names, argument lists and tensor shapes (tokens flattened
to ``[num_tokens, hidden]``, linear layers returning ``(output, bias)``).  The code is our own;
the behaviour follows vLLM 0.10.1 (file named in each class), brought in line with what real
vLLM 0.32 dumps show (``tests/data/real_vllm/``, see README.md "Where real vLLM differs"): one
rotary module shared by every layer (``get_rope``'s cache), the ``model`` module never dumped
(``@support_torch_compile``'s ``__call__``), int32 input ids, logits all-gathered to every TP rank,
the MoE router a ``GateLinear`` and the experts a ``MoERunner`` (expert weights in its
``routed_experts``, a module never called).  Linear weights stay visible: the empty ``[0]``
weights of real vLLM dumps are oneDNN prepacking on vLLM's CPU build only.  Kernels are the
PyTorch-native paths, except where a class documents a ``kernel`` switch.

Public API:
    build(hf_config, dtype=torch.float32, family="llama", **options) -> LlamaForCausalLM (or the
        family's subclass) for this process's TP rank; options: rms_kernel ("native"|"fused"),
        lm_head_dtype, act_override, extra_act_layer, norm_eps (override the config's eps),
        renormalize (override the config's norm_topk_prob in the MoE), expert_parallel (the MoE
        holds whole experts per rank, vLLM's --enable-expert-parallel).
    model.load_weights(hf_state_dict)          fuse q/k/v and gate/up, slice this rank's shard,
                                               pad the vocabulary (as vLLM's load_weights does)
    model(input_ids, positions) -> hidden      one engine forward (1-D token ids and positions)
    model.compute_logits(hidden) -> logits     on every rank; pass sampled rows only
    model.reset_cache()                        empty every layer's KV cache (a new sequence)
    generate(model, prompt_ids, new_tokens, step_scope=None) -> list[int]
        prefill then one engine forward per decoded token (greedy); ``step_scope(i)`` wraps
        engine forward i (msprobe_run.Probe.step_scope dumps each as one msprobe step)
    FAMILIES                                   family name -> top-level class

Unsupported on purpose (see README.md): chunked prefill, prefix caching, several sequences in one
batch; each sequence is one contiguous prefill followed by one token per decode step.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from . import dist

VOCAB_PADDING = 64  # vocab_parallel_embedding.py: DEFAULT_VOCAB_PADDING_SIZE


def _pad_vocab(n: int) -> int:
    return ((n + VOCAB_PADDING - 1) // VOCAB_PADDING) * VOCAB_PADDING


def _param(shape, dtype, loader) -> nn.Parameter:
    p = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
    p.weight_loader = loader
    return p


# ----------------------------------------------------------------------------- linear layers
class ReplicatedLinear(nn.Module):
    """vllm/model_executor/layers/linear.py (v0.10.1) ReplicatedLinear: full weight on every rank."""

    def __init__(self, in_features, out_features, bias=False, dtype=torch.float32):
        super().__init__()
        self.weight = _param((out_features, in_features), dtype, self.weight_loader)
        self.bias = _param((out_features,), dtype, self.weight_loader) if bias else None

    def weight_loader(self, param, loaded, shard_id=None):
        param.data.copy_(loaded.to(param.dtype))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias), None


class GateLinear(ReplicatedLinear):
    """vllm/model_executor/layers/fused_moe/router/gate_linear.py (v0.32) GateLinear: the MoE
    router, a ReplicatedLinear (special GEMM tiers on recent GPUs, F.linear otherwise)."""


class ColumnParallelLinear(nn.Module):
    """linear.py (v0.10.1) ColumnParallelLinear: rows of the weight split over ranks, output is this
    rank's shard (gather_output=False as every decoder layer uses it)."""

    def __init__(self, in_features, out_features, bias=False, dtype=torch.float32):
        super().__init__()
        self.out_per_rank = out_features // dist.world()
        self.weight = _param((self.out_per_rank, in_features), dtype, self.weight_loader)
        self.bias = _param((self.out_per_rank,), dtype, self.weight_loader) if bias else None

    def weight_loader(self, param, loaded, shard_id=None):
        param.data.copy_(dist.shard(loaded, 0).to(param.dtype))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias), None


class MergedColumnParallelLinear(ColumnParallelLinear):
    """linear.py (v0.10.1) MergedColumnParallelLinear: several column-parallel outputs stacked;
    rank r holds [out_0 shard r; out_1 shard r] (gate_up_proj = [gate_r; up_r])."""

    def __init__(self, in_features, output_sizes, bias=False, dtype=torch.float32):
        super().__init__(in_features, sum(output_sizes), bias, dtype)
        self.output_sizes = list(output_sizes)
        self.wrong_shard = None  # fault: (shard_id, rank to read it from, rank it hits)

    def weight_loader(self, param, loaded, shard_id=None):
        tp = dist.world()
        size = self.output_sizes[shard_id] // tp
        offset = sum(self.output_sizes[:shard_id]) // tp
        src_rank = dist.rank()
        if self.wrong_shard and self.wrong_shard[0] == shard_id and self.wrong_shard[2] == dist.rank():
            src_rank = self.wrong_shard[1]
        param.data[offset:offset + size].copy_(loaded.narrow(0, src_rank * size, size).to(param.dtype))


class QKVParallelLinear(ColumnParallelLinear):
    """linear.py (v0.10.1) QKVParallelLinear: rank r holds [q heads of r; k heads; v heads].  With
    fewer KV heads than ranks each KV head is replicated on tp/num_kv_heads ranks."""

    def __init__(self, hidden_size, head_size, total_num_heads, total_num_kv_heads, bias=False,
                 dtype=torch.float32):
        tp = dist.world()
        self.head_size = head_size
        self.num_heads = total_num_heads // tp
        if tp >= total_num_kv_heads:
            self.num_kv_heads, self.kv_replicas = 1, tp // total_num_kv_heads
        else:
            self.num_kv_heads, self.kv_replicas = total_num_kv_heads // tp, 1
        out = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp
        super().__init__(hidden_size, out, bias, dtype)

    def weight_loader(self, param, loaded, shard_id=None):
        q, kv = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        if shard_id is None:  # a checkpoint with qkv already fused (Phi-3)
            total_q = q * dist.world()
            total_kv = (loaded.shape[0] - total_q) // 2
            for sid, part in zip("qkv", loaded.split([total_q, total_kv, total_kv], 0)):
                self.weight_loader(param, part, sid)
            return
        if shard_id == "q":
            offset, size, idx = 0, q, dist.rank()
        else:
            offset = q if shard_id == "k" else q + kv
            size, idx = kv, dist.rank() // self.kv_replicas
        param.data[offset:offset + size].copy_(loaded.narrow(0, idx * size, size).to(param.dtype))


class RowParallelLinear(nn.Module):
    """linear.py (v0.10.1) RowParallelLinear: columns of the weight split over ranks (input is
    already a shard); the partial products are all-reduced inside forward (reduce_results=True),
    so every rank returns the full output.  The bias is added once, after the reduce."""

    def __init__(self, in_features, out_features, bias=False, dtype=torch.float32, reduce_results=True):
        super().__init__()
        self.reduce_results = reduce_results
        self.weight = _param((out_features, in_features // dist.world()), dtype, self.weight_loader)
        self.bias = _param((out_features,), dtype, self.bias_loader) if bias else None

    def weight_loader(self, param, loaded, shard_id=None):
        param.data.copy_(dist.shard(loaded, 1).to(param.dtype))

    def bias_loader(self, param, loaded, shard_id=None):
        param.data.copy_(loaded.to(param.dtype))

    def forward(self, x):
        out = F.linear(x, self.weight)
        if self.reduce_results:
            out = dist.all_reduce(out)
        if self.bias is not None:
            out = out + self.bias
        return out, None


# ----------------------------------------------------------------------------- embeddings / head
class VocabParallelEmbedding(nn.Module):
    """vllm/model_executor/layers/vocab_parallel_embedding.py (v0.10.1) VocabParallelEmbedding:
    the vocabulary is padded to a multiple of 64 and split in contiguous row ranges; ids outside
    this rank's range look up row 0 and are zeroed, then the ranks' outputs are all-reduced."""

    def __init__(self, num_embeddings, embedding_dim, dtype=torch.float32):
        super().__init__()
        self.org_vocab_size = num_embeddings
        self.num_embeddings_padded = _pad_vocab(num_embeddings)
        self.per_rank = self.num_embeddings_padded // dist.world()
        self.start = dist.rank() * self.per_rank
        self.weight = _param((self.per_rank, embedding_dim), dtype, self.weight_loader)

    def weight_loader(self, param, loaded, shard_id=None):
        rows = loaded[self.start:self.start + self.per_rank]
        param.data.zero_()  # padding rows stay zero, as vLLM leaves them
        param.data[:rows.shape[0]].copy_(rows.to(param.dtype))

    def forward(self, input_):
        if dist.world() == 1:
            return F.embedding(input_, self.weight)
        mask = (input_ >= self.start) & (input_ < self.start + self.per_rank)
        local = torch.where(mask, input_ - self.start, torch.zeros_like(input_))
        out = F.embedding(local, self.weight)
        out = out.masked_fill(~mask.unsqueeze(-1), 0)
        return dist.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """vocab_parallel_embedding.py (v0.10.1) ParallelLMHead: holds the output embedding shard and is
    never called; LogitsProcessor applies its weight."""

    def forward(self, input_):
        raise RuntimeError("LMHead's weights should be used in the sampler.")


class LogitsProcessor(nn.Module):
    """vllm/model_executor/layers/logits_processor.py (v0.10.1) LogitsProcessor: hidden states of the
    sampled positions only (the model runner selects them) times the head shard, all-gathered to
    every rank (vLLM 0.32: ``current_platform.use_all_gather()`` is True on every platform, so
    ``tensor_model_parallel_all_gather``; real dump ``llama_tp2_clean_stats_onestep`` rank1 holds
    the full logits), padding columns cut, soft cap and scale."""

    def __init__(self, vocab_size, org_vocab_size=None, scale=1.0, soft_cap=None):
        super().__init__()
        self.vocab_size = vocab_size
        self.org_vocab_size = org_vocab_size or vocab_size
        self.scale = scale
        self.soft_cap = soft_cap

    def forward(self, lm_head, hidden_states, sampling_metadata=None, embedding_bias=None):
        # a head kept in another dtype than the model computes the logits in the head's dtype
        logits = F.linear(hidden_states.to(lm_head.weight.dtype), lm_head.weight)
        logits = dist.all_gather_last_dim(logits)
        logits = logits[..., :self.org_vocab_size]
        if self.soft_cap is not None:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        if self.scale != 1.0:
            logits = logits * self.scale
        return logits


# ----------------------------------------------------------------------------- small layers
class RMSNorm(nn.Module):
    """vllm/model_executor/layers/layernorm.py (v0.10.1) RMSNorm: ``norm(x)`` or
    ``norm(x, residual) -> (out, x + residual)`` (the residual add is fused into the norm).
    kernel="native" is forward_native (fp32 statistics, result cast to the input dtype, then times
    the weight); kernel="fused" rounds once like the CUDA kernel (weight applied in fp32)."""

    def __init__(self, hidden_size, eps=1e-6, dtype=torch.float32, kernel="native"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.variance_epsilon = eps
        self.kernel = kernel

    def _scale(self, x32):
        return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    def _weighted(self, x32, dtype):
        if self.kernel == "fused":
            return (x32 * self.weight.float()).to(dtype)
        return x32.to(dtype) * self.weight

    def forward(self, x, residual=None):
        dtype = x.dtype
        x32 = x.float()
        if residual is not None:
            x32 = x32 + residual.float()
            residual = x32.to(dtype)
        out = self._weighted(self._scale(x32), dtype)
        return out if residual is None else (out, residual)


class GemmaRMSNorm(RMSNorm):
    """layernorm.py (v0.10.1) GemmaRMSNorm: weight stored as w, applied as (1 + w), all in fp32."""

    def __init__(self, hidden_size, eps=1e-6, dtype=torch.float32, kernel="native"):
        super().__init__(hidden_size, eps, dtype, kernel)
        self.weight.data.zero_()

    def _weighted(self, x32, dtype):
        return (x32 * (1.0 + self.weight.float())).to(dtype)


class SiluAndMul(nn.Module):
    """vllm/model_executor/layers/activation.py (v0.10.1) SiluAndMul: silu(x[:d]) * x[d:]."""

    def __init__(self, override=None):
        super().__init__()
        self.override = override  # fault: another activation behind the same module

    def forward(self, x):
        d = x.shape[-1] // 2
        act = F.gelu(x[..., :d], approximate="tanh") if self.override == "gelu" else F.silu(x[..., :d])
        return act * x[..., d:]


class GeluAndMul(nn.Module):
    """activation.py (v0.10.1) GeluAndMul (approximate="tanh" for Gemma 2): gelu(x[:d]) * x[d:]."""

    def __init__(self, approximate="tanh"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate=self.approximate) * x[..., d:]


class RotaryEmbedding(nn.Module):
    """vllm/model_executor/layers/rotary_embedding.py (v0.10.1) RotaryEmbedding (neox style):
    ``rotary_emb(positions, query, key) -> (query, key)`` on flattened heads; the cos/sin cache is
    computed in fp32 and stored in the model dtype."""

    def __init__(self, head_size, max_position, base, dtype=torch.float32):
        super().__init__()
        self.head_size = head_size
        inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.float) / head_size))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float), inv_freq)
        self.register_buffer("cos_sin_cache", torch.cat([freqs.cos(), freqs.sin()], -1).to(dtype),
                             persistent=False)

    def _rotate(self, x, cos, sin):
        shape = x.shape
        x = x.view(x.shape[0], -1, self.head_size)
        x1, x2 = x.chunk(2, dim=-1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return out.reshape(shape)

    def forward(self, positions, query, key):
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)


def get_rope(opts, head_size, max_position, base, dtype):
    """rotary_embedding/__init__.py get_rope: one RotaryEmbedding per rope setting, cached, so every
    layer with the same setting holds the same module object; msprobe registers it once, under
    its first path (``model.layers.0.self_attn.rotary_emb``), and numbers its calls across layers
    (call index = forward call x layers + layer).  The cache lives in this build's ``opts``
    (vLLM's is per process) so that two models built in one process never share hooks.  SGLang's
    get_rope caches the same way (sglang_like uses this one)."""
    cache = opts.setdefault("_rope_cache", {})
    key = (head_size, max_position, float(base), dtype)
    if key not in cache:
        cache[key] = RotaryEmbedding(head_size, max_position, base, dtype)
    return cache[key]


class Attention(nn.Module):
    """vllm/attention/layer.py (v0.10.1) Attention: ``attn(q, k, v) -> [num_tokens, heads*head]``.
    Keeps this sequence's K/V (the paged cache reduced to one contiguous sequence); the new tokens
    are the last ones of the cache.  Softmax in fp32 like the flash kernels; optional sliding
    window (last ``sliding_window`` positions, self included) and logit soft cap."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads, sliding_window=None,
                 logits_soft_cap=None):
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.k_cache = self.v_cache = None

    def forward(self, query, key, value):
        t = query.shape[0]
        k = key.view(t, self.num_kv_heads, self.head_size)
        v = value.view(t, self.num_kv_heads, self.head_size)
        self.k_cache = k if self.k_cache is None else torch.cat([self.k_cache, k])
        self.v_cache = v if self.v_cache is None else torch.cat([self.v_cache, v])
        s = self.k_cache.shape[0]
        q = query.view(t, self.num_heads, self.head_size).transpose(0, 1).float()
        rep = self.num_heads // self.num_kv_heads
        kk = self.k_cache.transpose(0, 1).float().repeat_interleave(rep, 0)
        vv = self.v_cache.transpose(0, 1).float().repeat_interleave(rep, 0)
        scores = (q @ kk.transpose(1, 2)) * self.scale
        if self.logits_soft_cap:
            scores = torch.tanh(scores / self.logits_soft_cap) * self.logits_soft_cap
        qpos = torch.arange(s - t, s).unsqueeze(1)
        kpos = torch.arange(s).unsqueeze(0)
        allowed = kpos <= qpos
        if self.sliding_window:
            allowed &= (qpos - kpos) < self.sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ vv
        return out.transpose(0, 1).reshape(t, self.num_heads * self.head_size).to(query.dtype)


# ----------------------------------------------------------------------------- Llama family
def first_norm(norm, hidden_states, residual):
    """A decoder layer's input norm as vLLM calls it: plain in the first layer (the residual
    starts as the embedding), fused with the residual add in the others."""
    if residual is None:
        return norm(hidden_states), hidden_states
    return norm(hidden_states, residual)


def _rope_theta(cfg) -> float:
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return float(theta)


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


class LlamaMLP(nn.Module):
    """vllm/model_executor/models/llama.py (v0.10.1) LlamaMLP: gate_up_proj -> act_fn -> down_proj.
    ``extra_act`` (a fault) inserts one more activation module between act_fn and down_proj."""

    def __init__(self, hidden_size, intermediate_size, opts, bias=False):
        super().__init__()
        dtype = opts["dtype"]
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias, dtype)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, dtype)
        self.act_fn = opts.get("act_cls", SiluAndMul)() if not opts.get("act_override") else \
            SiluAndMul(opts["act_override"])
        if opts.get("extra_act"):
            self.activation = nn.SiLU()

    def forward(self, x):
        gate_up, _ = self.gate_up_proj(x)
        x = self.act_fn(gate_up)
        if hasattr(self, "activation"):
            x = self.activation(x)
        x, _ = self.down_proj(x)
        return x


class LlamaAttention(nn.Module):
    """llama.py (v0.10.1) LlamaAttention: qkv_proj -> split -> rotary_emb -> attn -> o_proj."""

    def __init__(self, cfg, layer_idx, opts, bias=False):
        super().__init__()
        dtype = opts["dtype"]
        self.head_dim = _head_dim(cfg)
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, self.head_dim, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, bias, dtype)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * self.head_dim, cfg.hidden_size,
                                        getattr(cfg, "attention_bias", False) and not bias, dtype)
        self.rotary_emb = get_rope(opts, self.head_dim, cfg.max_position_embeddings, _rope_theta(cfg), dtype)
        self.attn = Attention(self.num_heads, self.head_dim, self._scale(cfg), self.num_kv_heads,
                              self._sliding_window(cfg, layer_idx), self._soft_cap(cfg))

    def _scale(self, cfg):
        return self.head_dim ** -0.5

    def _sliding_window(self, cfg, layer_idx):
        return getattr(cfg, "sliding_window", None)

    def _soft_cap(self, cfg):
        return None

    def _qk_norm(self, q, k):
        return q, k

    def forward(self, positions, hidden_states):
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self._qk_norm(q, k)
        q, k = self.rotary_emb(positions, q, k)
        attn_output = self.attn(q, k, v)
        output, _ = self.o_proj(attn_output)
        return output


class LlamaDecoderLayer(nn.Module):
    """llama.py (v0.10.1) LlamaDecoderLayer: ``layer(positions, hidden, residual) -> (hidden,
    residual)``; the first layer gets residual=None and norms plainly, later ones call
    ``input_layernorm(hidden, residual)``."""

    attention_cls = LlamaAttention
    mlp_cls = LlamaMLP
    qkv_bias = False

    def __init__(self, cfg, layer_idx, opts):
        super().__init__()
        dtype, eps, kernel = opts["dtype"], opts["eps"], opts.get("rms_kernel", "native")
        self.self_attn = self.attention_cls(cfg, layer_idx, opts, self.qkv_bias)
        self.mlp = self._mlp(cfg, {**opts, "extra_act": opts.get("extra_act_layer") == layer_idx})
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps, dtype, kernel)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps, dtype, kernel)

    def _mlp(self, cfg, opts):
        return self.mlp_cls(cfg.hidden_size, cfg.intermediate_size, opts)

    def forward(self, positions, hidden_states, residual):
        hidden_states, residual = first_norm(self.input_layernorm, hidden_states, residual)
        hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        hidden_states = self.mlp(hidden_states)
        return hidden_states, residual


class CompiledModule(nn.Module):
    """vllm/compilation/decorators.py (v0.32) ``@support_torch_compile``: the decorated class's
    ``__call__`` is replaced by one that calls ``self.forward`` directly (eager mode included), so
    ``nn.Module``'s hooks, msprobe's among them, never run for it: no ``Module.model.LlamaModel``
    entry in a real dump, and its children have parent ``null`` in construct.json.  Set
    ``hooked = True`` on a subclass for an engine that calls it as a plain module (sglang_like)."""

    hooked = False

    def __call__(self, *args, **kwargs):
        if self.hooked:
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)


class LlamaModel(CompiledModule):
    """llama.py (v0.10.1) LlamaModel: embed_tokens -> layers -> norm(hidden, residual); decorated
    with ``@support_torch_compile`` (never dumped, see CompiledModule)."""

    layer_cls = LlamaDecoderLayer
    norm_cls = RMSNorm

    def __init__(self, cfg, opts):
        super().__init__()
        dtype = opts["dtype"]
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.ModuleList(self.layer_cls(cfg, i, opts) for i in range(cfg.num_hidden_layers))
        self.norm = self.norm_cls(cfg.hidden_size, opts["eps"], dtype, opts.get("rms_kernel", "native"))

    def _embed(self, input_ids):
        return self.embed_tokens(input_ids)

    def forward(self, input_ids, positions):
        hidden_states, residual = self._embed(input_ids), None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    """llama.py (v0.10.1) LlamaForCausalLM: model, lm_head (ParallelLMHead, never called),
    logits_processor; forward returns hidden states, compute_logits runs the logits processor."""

    model_cls = LlamaModel
    # vLLM's stacked_params_mapping: (fused param, checkpoint name, shard id)
    stacked_params_mapping = [(".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"),
                              (".qkv_proj", ".v_proj", "v"), (".gate_up_proj", ".gate_proj", 0),
                              (".gate_up_proj", ".up_proj", 1)]

    def __init__(self, cfg, opts):
        super().__init__()
        self.config = cfg
        self.model = self.model_cls(cfg, opts)
        if getattr(cfg, "tie_word_embeddings", False):
            # vLLM ties by making lm_head the embedding module itself (one module, dumped once)
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size,
                                          opts.get("lm_head_dtype") or opts["dtype"])
        self.logits_processor = LogitsProcessor(self.lm_head.num_embeddings_padded, cfg.vocab_size,
                                                soft_cap=getattr(cfg, "final_logit_softcapping", None))

    def forward(self, input_ids, positions):
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states):
        return self.logits_processor(self.lm_head, hidden_states)

    def reset_cache(self):
        for m in self.modules():
            if isinstance(m, Attention):
                m.k_cache = m.v_cache = None

    def _default_loader(self, param, loaded, shard_id=None):
        param.data.copy_(loaded.to(param.dtype))

    def load_weights(self, weights):
        """Load an HF state dict (name -> tensor) the way vLLM's load_weights maps it."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights.items():
            if "rotary_emb.inv_freq" in name or (name == "lm_head.weight" and self.lm_head is self.model.embed_tokens):
                continue
            target, shard_id = self._rename(name), None
            if target == name:
                for fused, part, sid in self.stacked_params_mapping:
                    if part in name:
                        target, shard_id = name.replace(part, fused), sid
                        break
            if target not in params:
                raise KeyError(f"{type(self).__name__}: no parameter for checkpoint tensor {name}")
            p = params[target]
            getattr(p, "weight_loader", self._default_loader)(p, w, shard_id)
            loaded.add(target)
        missing = set(params) - loaded
        if missing:
            raise KeyError(f"{type(self).__name__}: checkpoint lacks {sorted(missing)}")

    def _rename(self, name):
        return name


# ----------------------------------------------------------------------------- Qwen2 / Qwen3
class Qwen2MLP(LlamaMLP):
    """vllm/model_executor/models/qwen2.py (v0.10.1) Qwen2MLP (same calls as LlamaMLP)."""


class Qwen2Attention(LlamaAttention):
    """qwen2.py (v0.10.1) Qwen2Attention: QKVParallelLinear with bias, o_proj without."""


class Qwen2DecoderLayer(LlamaDecoderLayer):
    """qwen2.py (v0.10.1) Qwen2DecoderLayer."""
    attention_cls, mlp_cls, qkv_bias = Qwen2Attention, Qwen2MLP, True


class Qwen2Model(LlamaModel):
    """qwen2.py (v0.10.1) Qwen2Model."""
    layer_cls = Qwen2DecoderLayer


class Qwen2ForCausalLM(LlamaForCausalLM):
    """qwen2.py (v0.10.1) Qwen2ForCausalLM."""
    model_cls = Qwen2Model


class Qwen3Attention(LlamaAttention):
    """vllm/model_executor/models/qwen3.py (v0.10.1) Qwen3Attention: per-head RMSNorm q_norm and
    k_norm (weight [head_dim]) on q and k before the rotary embedding."""

    def __init__(self, cfg, layer_idx, opts, bias=False):
        super().__init__(cfg, layer_idx, opts, getattr(cfg, "attention_bias", False))
        kernel = opts.get("rms_kernel", "native")
        self.q_norm = RMSNorm(self.head_dim, opts["eps"], opts["dtype"], kernel)
        self.k_norm = RMSNorm(self.head_dim, opts["eps"], opts["dtype"], kernel)

    def _qk_norm(self, q, k):
        q = self.q_norm(q.view(*q.shape[:-1], -1, self.head_dim)).view(q.shape)
        k = self.k_norm(k.view(*k.shape[:-1], -1, self.head_dim)).view(k.shape)
        return q, k

    def _sliding_window(self, cfg, layer_idx):
        return None


class Qwen3DecoderLayer(LlamaDecoderLayer):
    """qwen3.py (v0.10.1) Qwen3DecoderLayer (its MLP is qwen2.py's Qwen2MLP)."""
    attention_cls, mlp_cls = Qwen3Attention, Qwen2MLP


class Qwen3Model(LlamaModel):
    """qwen3.py (v0.10.1) Qwen3Model."""
    layer_cls = Qwen3DecoderLayer


class Qwen3ForCausalLM(LlamaForCausalLM):
    """qwen3.py (v0.10.1) Qwen3ForCausalLM."""
    model_cls = Qwen3Model


# ----------------------------------------------------------------------------- Phi-3
class Phi3ForCausalLM(LlamaForCausalLM):
    """vllm/model_executor/models/phi3.py (v0.10.1) Phi3ForCausalLM: LlamaForCausalLM whose
    checkpoint already holds qkv_proj and gate_up_proj fused (loaded with shard_id None)."""

    def load_weights(self, weights):
        fixed = {}
        inter = self.config.intermediate_size
        for name, w in weights.items():
            if name.endswith("mlp.gate_up_proj.weight"):  # [gate; up] in the checkpoint
                fixed[name.replace("gate_up_proj", "gate_proj")] = w[:inter]
                fixed[name.replace("gate_up_proj", "up_proj")] = w[inter:]
            else:
                fixed[name] = w
        # the fused qkv weight goes through QKVParallelLinear's shard_id=None path
        return super().load_weights(fixed)


# ----------------------------------------------------------------------------- Gemma 2
class Gemma2MLP(LlamaMLP):
    """vllm/model_executor/models/gemma2.py (v0.10.1) Gemma2MLP: GeluAndMul(approximate="tanh")."""

    def __init__(self, hidden_size, intermediate_size, opts, bias=False):
        super().__init__(hidden_size, intermediate_size, {**opts, "act_cls": GeluAndMul}, bias)


class Gemma2Attention(LlamaAttention):
    """gemma2.py (v0.10.1) Gemma2Attention: scale query_pre_attn_scalar**-0.5, attention logit soft
    cap, sliding window on the even layers."""

    def _scale(self, cfg):
        return cfg.query_pre_attn_scalar ** -0.5

    def _sliding_window(self, cfg, layer_idx):
        return cfg.sliding_window if layer_idx % 2 == 0 else None

    def _soft_cap(self, cfg):
        return cfg.attn_logit_softcapping


class Gemma2DecoderLayer(nn.Module):
    """gemma2.py (v0.10.1) Gemma2DecoderLayer: input_layernorm(h, residual) -> self_attn ->
    post_attention_layernorm(h) -> pre_feedforward_layernorm(h, residual) -> mlp ->
    post_feedforward_layernorm(h); all four are GemmaRMSNorm."""

    def __init__(self, cfg, layer_idx, opts):
        super().__init__()
        dtype, eps = opts["dtype"], opts["eps"]
        self.self_attn = Gemma2Attention(cfg, layer_idx, opts, False)
        self.mlp = Gemma2MLP(cfg.hidden_size, cfg.intermediate_size, opts)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, GemmaRMSNorm(cfg.hidden_size, eps, dtype))

    def forward(self, positions, hidden_states, residual):
        hidden_states, residual = first_norm(self.input_layernorm, hidden_states, residual)
        hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states, residual = self.pre_feedforward_layernorm(hidden_states, residual)
        hidden_states = self.mlp(hidden_states)
        hidden_states = self.post_feedforward_layernorm(hidden_states)
        return hidden_states, residual


class Gemma2Model(LlamaModel):
    """gemma2.py (v0.10.1) Gemma2Model: embeddings times sqrt(hidden) (the normalizer rounded to
    the model dtype), GemmaRMSNorm final norm."""

    layer_cls, norm_cls = Gemma2DecoderLayer, GemmaRMSNorm

    def _embed(self, input_ids):
        h = self.embed_tokens(input_ids)
        return h * torch.tensor(math.sqrt(h.shape[-1]), dtype=h.dtype)


class Gemma2ForCausalLM(LlamaForCausalLM):
    """gemma2.py (v0.10.1) Gemma2ForCausalLM: the head is model.embed_tokens (tied), final logit
    soft cap in the LogitsProcessor."""
    model_cls = Gemma2Model


# ----------------------------------------------------------------------------- Qwen3-MoE
class FusedMoE(nn.Module):
    """vllm/model_executor/layers/fused_moe/layer.py (v0.10.1) FusedMoE, held since v0.32 as the
    ``routed_experts`` of a ``MoERunner`` and never called as a module (``compute``), so msprobe
    dumps neither it nor its weights: every expert's [gate; up]
    in ``w13_weight`` [E, 2*I/tp, H] and down in ``w2_weight`` [E, H, I/tp] (TP splits the
    intermediate dim of every expert); softmax top-k routing in fp32, renormalised when asked.
    With ``reduce_results=False`` (as Qwen3-MoE builds it) the output is this rank's partial sum and
    the block all-reduces it afterwards.

    ``expert_parallel`` (``--enable-expert-parallel``): the MoE's own TP size becomes 1 and each
    rank holds whole experts instead, ``w13_weight`` [E_local, 2*I, H]; ``determine_expert_map``'s
    linear placement gives rank r a contiguous block (the first E % ranks ranks one more) and
    ``expert_map`` maps a global expert to its local index, -1 when another rank holds it. Every
    rank routes all its tokens and computes only its own experts, so the output is still a partial
    sum, completed by the same all-reduce."""

    def __init__(self, num_experts, top_k, hidden_size, intermediate_size, reduce_results, renormalize,
                 dtype=torch.float32, expert_parallel=False):
        super().__init__()
        self.top_k, self.renormalize, self.reduce_results = top_k, renormalize, reduce_results
        self.expert_parallel = expert_parallel
        if expert_parallel:
            self.inter = intermediate_size
            base, extra = divmod(num_experts, dist.world())
            local = base + (dist.rank() < extra)
            self.first_expert = dist.rank() * base + min(dist.rank(), extra)
            self.expert_map = torch.full((num_experts,), -1, dtype=torch.int32)
            self.expert_map[self.first_expert:self.first_expert + local] = torch.arange(local, dtype=torch.int32)
        else:
            self.inter, local, self.expert_map = intermediate_size // dist.world(), num_experts, None
        self.w13_weight = _param((local, 2 * self.inter, hidden_size), dtype, self.weight_loader)
        self.w2_weight = _param((local, hidden_size, self.inter), dtype, self.weight_loader)

    def weight_loader(self, param, loaded, shard_id=None):
        if self.expert_parallel:  # this rank's whole experts
            param.data.copy_(loaded.narrow(0, self.first_expert, param.shape[0]).to(param.dtype))
        elif param is self.w13_weight:  # loaded: [E, 2*I, H] = gate rows then up rows
            gate, up = loaded.chunk(2, dim=1)
            param.data.copy_(torch.cat([dist.shard(gate, 1), dist.shard(up, 1)], dim=1).to(param.dtype))
        else:  # [E, H, I]
            param.data.copy_(dist.shard(loaded, 2).to(param.dtype))

    def compute(self, hidden_states, router_logits):
        probs = torch.softmax(router_logits.float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros(hidden_states.shape, dtype=torch.float32)
        for e in experts.unique().tolist():
            local = e if self.expert_map is None else int(self.expert_map[e])
            if local < 0:  # held by another rank
                continue
            rows, slot = (experts == e).nonzero(as_tuple=True)
            gate_up = F.linear(hidden_states[rows], self.w13_weight[local])
            act = F.silu(gate_up[..., :self.inter]) * gate_up[..., self.inter:]
            out.index_add_(0, rows, F.linear(act, self.w2_weight[local]).float() * weights[rows, slot, None])
        out = out.to(hidden_states.dtype)
        return dist.all_reduce(out) if self.reduce_results else out


class MoERunner(nn.Module):
    """vllm/model_executor/layers/fused_moe/runner/moe_runner.py (v0.32) MoERunner: what
    ``FusedMoEFactory`` returns, so the model's ``experts`` attribute.  Holds the routed experts
    (``routed_experts``, a FusedMoE never called as a module: its weights are in no dump entry)
    and, when the model hands it over, the router (``gate``, the block's own GateLinear: one module,
    dumped under its first path ``mlp.gate``, its parent the MoERunner in construct.json).  With a
    gate, ``router_logits`` is ignored and recomputed from ``hidden_states`` (Qwen3-MoE passes the
    hidden states as ``router_logits``).  The output is all-reduced over TP/EP ranks here."""

    def __init__(self, routed_experts, gate=None):
        super().__init__()
        self.routed_experts = routed_experts
        self.gate = gate

    def forward(self, hidden_states, router_logits):
        if self.gate is not None:
            router_logits, _ = self.gate(hidden_states)
        out = self.routed_experts.compute(hidden_states, router_logits)
        return dist.all_reduce(out)


class Qwen3MoeSparseMoeBlock(nn.Module):
    """vllm/model_executor/models/qwen3_moe.py (v0.32) Qwen3MoeSparseMoeBlock: gate (GateLinear)
    handed to the experts (MoERunner), called as ``experts(hidden_states=h, router_logits=h)``;
    the runner computes the router logits and all-reduces its output."""

    def __init__(self, cfg, opts):
        super().__init__()
        self.gate = GateLinear(cfg.hidden_size, cfg.num_experts, False, opts["dtype"])
        self.experts = MoERunner(FusedMoE(cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size,
                                          cfg.moe_intermediate_size, False,
                                          opts.get("renormalize", cfg.norm_topk_prob), opts["dtype"],
                                          opts.get("expert_parallel", False)), gate=self.gate)

    def forward(self, hidden_states):
        return self.experts(hidden_states=hidden_states, router_logits=hidden_states)


class Qwen3MoeAttention(Qwen3Attention):
    """qwen3_moe.py (v0.10.1) Qwen3MoeAttention (q_norm and k_norm like Qwen3Attention)."""


class Qwen3MoeDecoderLayer(LlamaDecoderLayer):
    """qwen3_moe.py (v0.10.1) Qwen3MoeDecoderLayer: every layer sparse (decoder_sparse_step 1)."""

    attention_cls = Qwen3MoeAttention

    def _mlp(self, cfg, opts):
        return Qwen3MoeSparseMoeBlock(cfg, opts)


class Qwen3MoeModel(LlamaModel):
    """qwen3_moe.py (v0.10.1) Qwen3MoeModel."""
    layer_cls = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    """qwen3_moe.py (v0.10.1) Qwen3MoeForCausalLM.  Loads the transformers 5 layout, where each
    layer's experts are already stacked (``mlp.experts.gate_up_proj`` [E, 2*I, H],
    ``mlp.experts.down_proj`` [E, H, I]) instead of vLLM's per-expert checkpoint names."""

    model_cls = Qwen3MoeModel

    def _rename(self, name):
        return name.replace("mlp.experts.gate_up_proj", "mlp.experts.routed_experts.w13_weight").replace(
            "mlp.experts.down_proj", "mlp.experts.routed_experts.w2_weight")


FAMILIES = {"llama": LlamaForCausalLM, "mistral": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM,
            "qwen3": Qwen3ForCausalLM, "phi3": Phi3ForCausalLM, "gemma2": Gemma2ForCausalLM,
            "qwen3_moe": Qwen3MoeForCausalLM}


def build(hf_config, dtype=torch.float32, family="llama", **options) -> nn.Module:
    """The rollout model of ``family`` for this TP rank (see the module docstring for options)."""
    opts = {"dtype": dtype, "eps": options.pop("norm_eps", None) or hf_config.rms_norm_eps, **options}
    return FAMILIES[family](hf_config, opts)


@torch.no_grad()
def generate(model, prompt_ids, new_tokens, step_scope=None) -> list[int]:
    """Greedy generation, one engine forward (model forward + compute_logits + sampling) per
    step; ``step_scope(i)`` is a context manager wrapped around engine forward i.  Returns the
    sampled tokens (the same on every rank)."""
    model.reset_cache()
    # the model runner's input_ids buffer is int32 (real dump: embed_tokens input torch.int32)
    ids = torch.as_tensor(prompt_ids, dtype=torch.int32)
    positions = torch.arange(ids.shape[0])
    out = []
    for i in range(new_tokens):
        with (step_scope(i) if step_scope is not None else contextlib.nullcontext()):
            hidden = model(ids, positions)
            logits = model.compute_logits(hidden[-1:])  # the last position is the only sampled one
        tok = dist.broadcast_int(int(logits[-1].float().argmax()))
        out.append(tok)
        ids = torch.tensor([tok], dtype=torch.int32)
        positions = positions[-1:] + 1
    return out
