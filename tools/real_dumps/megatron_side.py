"""Train side of the real-dump corpus: a megatron-core ``GPTModel`` (local layer spec) on CPU.

A tiny HF Llama checkpoint is converted into Megatron's layout (fused per-query-group QKV, fused
[gate; up] fc1, column/row-parallel shards per TP rank, layers split over PP stages) and run over
gloo, one process per rank, as a Megatron training job lays the ranks out (TP inner, PP outer).

What megatron-core 0.16 needs to run on a CPU-only torch, and how this module gets it:

* Config flags (no patch): ``use_cpu_initialization``; every fusion off (``bias_activation_fusion``,
  ``masked_softmax_fusion``, ``apply_rope_fusion``, ``gradient_accumulation_fusion``,
  ``persist_layer_norm``); ``batch_p2p_comm=False`` so that pipeline sends are plain
  ``isend``/``irecv`` (the batched path ends in ``torch.cuda.synchronize``).
* An explicit causal ``attention_mask``: with ``None`` the torch softmax path builds its default
  mask with ``device="cuda"`` (``transformer/utils.py: get_default_causal_mask``).
* ``initialize_rng_tracker(inference_rng_tracker=True)``: ``DotProductAttention`` forks the CUDA
  RNG tracker around attention dropout, which needs CUDA RNG states; the inference tracker (a
  public option) forks into a null context.  Dropout is 0 and the model is in eval mode anyway.
* Sequence parallel: the local spec's norm (``WrappedTorchNorm``) refuses it, because the
  gradients of norm weights that see only a sequence shard need an extra all-reduce which only the
  Apex/TE norms arrange; neither is installable on CPU.  Forward is unaffected, so SP layouts
  build the same spec with :class:`RMSNorm` (``torch.nn.RMSNorm`` taking Megatron's arguments and
  tagging its weight ``sequence_parallel`` as the Apex norm does) for the layer and final norms.
  The class name in the dump stays ``RMSNorm``.
* One monkeypatch, scoped to :func:`cpu_device` (entered around model construction, forward and
  pipeline communication): ``torch.cuda.current_device`` returns ``"cpu"``.
  ``RotaryEmbedding.get_emb`` moves ``inv_freq`` to ``torch.cuda.current_device()`` on its first
  call whatever the config says, and the pipeline communicator allocates its receive buffers
  there.  No flag avoids either; with the patch both land on the CPU and nothing else changes.

Pipeline parallelism: the two stages run in two processes; stage 0 sends its hidden states with
megatron-core's own ``P2PCommunicator.send_forward`` and stage 1 receives them with
``recv_forward`` and feeds them through ``set_input_tensor`` (what ``forward_step`` does inside
megatron's schedules).  The schedules themselves are not used: they need a loss function and a
data iterator and add nothing a forward-only dump shows.

Public API:
    HF_CONFIG                                  the tiny Llama config (dict for LlamaConfig)
    make_hf_llama(seed) -> LlamaForCausalLM    fp32, eval mode, fixed seed
    convert(hf_state, hf_config, tp_rank, tp, layers, pre, post, qkv_order) -> state dict
    Layout(tp, pp, sp)                         one job layout; ``world`` = tp * pp
    run_ranks(layout, fn, *args)               run ``fn(layout, *args)`` in tp*pp gloo processes
    build_stage(layout, hf_model, qkv_order, faults) -> GPTModel for this process's rank
    stage_forward(layout, model, input_ids) -> logits on the last stage (vocab shard), else None
    gather_logits(layout, logits) -> full-vocab logits [b, s, v] (TP all-gather, for checking)
"""
from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass

import torch
import torch.nn.functional as F

HF_CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                 rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                 hidden_act="silu", attention_bias=False, mlp_bias=False,
                 attn_implementation="eager")

QKV_ORDERS = ("interleaved", "plain")


@dataclass(frozen=True)
class Layout:
    """One Megatron job layout: tensor-parallel size, pipeline size, sequence parallel."""

    tp: int = 1
    pp: int = 1
    sp: bool = False

    @property
    def world(self) -> int:
        return self.tp * self.pp


def make_hf_llama(seed: int = 0):
    """The tiny HF Llama every Megatron case converts from (fp32, eval, weights from ``seed``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**HF_CONFIG)).eval()


@contextlib.contextmanager
def cpu_device():
    """Make ``torch.cuda.current_device()`` answer ``"cpu"`` while megatron-core runs (see above)."""
    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        torch.cuda.current_device = saved


def _qkv_rows(hf_state, prefix, cfg, order):
    """The full fused QKV weight of one layer in Megatron's row order.

    Megatron splits the fused output per query group: group g holds its ``heads/groups`` query
    heads, then its key head, then its value head.  ``plain`` stacks [q; k; v] instead, the
    classic conversion bug (same shape, rows in the wrong places).
    """
    q = hf_state[f"{prefix}.q_proj.weight"]
    k = hf_state[f"{prefix}.k_proj.weight"]
    v = hf_state[f"{prefix}.v_proj.weight"]
    if order == "plain":
        return torch.cat([q, k, v], dim=0)
    groups = cfg["num_key_value_heads"]
    hidden = q.shape[1]
    qg = q.view(groups, -1, hidden)
    kg = k.view(groups, -1, hidden)
    vg = v.view(groups, -1, hidden)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, hidden)


def _rows(t, tp_rank, tp):
    n = t.shape[0] // tp
    return t[tp_rank * n:(tp_rank + 1) * n]


def _cols(t, tp_rank, tp):
    n = t.shape[1] // tp
    return t[:, tp_rank * n:(tp_rank + 1) * n]


def convert(hf_state, cfg, tp_rank, tp, layers, pre, post, qkv_order="interleaved"):
    """HF Llama state dict -> the local state dict of one Megatron rank.

    ``layers`` are the global layer numbers this pipeline stage holds; they become local indices
    0.. (Megatron numbers a stage's modules from 0).  Column-parallel weights (qkv, fc1, output
    layer, vocab embedding) keep rows of this TP rank, row-parallel ones (proj, fc2) columns.
    """
    if qkv_order not in QKV_ORDERS:
        raise ValueError(f"qkv_order must be one of {QKV_ORDERS}")
    out = {}
    if pre:
        out["embedding.word_embeddings.weight"] = _rows(hf_state["model.embed_tokens.weight"], tp_rank, tp)
    for local, layer in enumerate(layers):
        src, dst = f"model.layers.{layer}", f"decoder.layers.{local}"
        out[f"{dst}.input_layernorm.weight"] = hf_state[f"{src}.input_layernorm.weight"]
        out[f"{dst}.pre_mlp_layernorm.weight"] = hf_state[f"{src}.post_attention_layernorm.weight"]
        out[f"{dst}.self_attention.linear_qkv.weight"] = _rows(
            _qkv_rows(hf_state, f"{src}.self_attn", cfg, qkv_order), tp_rank, tp)
        out[f"{dst}.self_attention.linear_proj.weight"] = _cols(
            hf_state[f"{src}.self_attn.o_proj.weight"], tp_rank, tp)
        # fc1 is column-parallel over a fused [gate; up]: rank r holds [gate_r; up_r]
        out[f"{dst}.mlp.linear_fc1.weight"] = torch.cat(
            [_rows(hf_state[f"{src}.mlp.gate_proj.weight"], tp_rank, tp),
             _rows(hf_state[f"{src}.mlp.up_proj.weight"], tp_rank, tp)], dim=0)
        out[f"{dst}.mlp.linear_fc2.weight"] = _cols(hf_state[f"{src}.mlp.down_proj.weight"], tp_rank, tp)
    if post:
        out["decoder.final_layernorm.weight"] = hf_state["model.norm.weight"]
        out["output_layer.weight"] = _rows(hf_state["lm_head.weight"], tp_rank, tp)
    return out


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` built from Megatron's norm arguments, allowed under sequence parallel."""

    def __init__(self, config, hidden_size, eps=1e-5, **_unused):
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = True


def _layer_spec(layout: Layout, cfg):
    import dataclasses

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    if not layout.sp:
        return spec
    layer = dataclasses.replace(spec, submodules=dataclasses.replace(
        spec.submodules, input_layernorm=RMSNorm, pre_mlp_layernorm=RMSNorm))
    return TransformerBlockSubmodules(layer_specs=[layer] * (cfg["num_hidden_layers"] // layout.pp),
                                      layer_norm=RMSNorm)


def _transformer_config(layout: Layout, cfg):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"],
        num_attention_heads=cfg["num_attention_heads"], num_query_groups=cfg["num_key_value_heads"],
        ffn_hidden_size=cfg["intermediate_size"], normalization="RMSNorm",
        layernorm_epsilon=cfg["rms_norm_eps"], gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        sequence_parallel=layout.sp, params_dtype=torch.float32, pipeline_dtype=torch.float32,
        use_cpu_initialization=True, bias_activation_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
        batch_p2p_comm=False)


def _init_parallel(layout: Layout) -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=layout.tp,
                                             pipeline_model_parallel_size=layout.pp)
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


def build_stage(layout: Layout, hf_model, qkv_order="interleaved", faults=()):
    """The GPTModel of this process's rank, loaded from ``hf_model``.

    ``faults`` are callables ``fault(model, layout)`` applied to the loaded Megatron model (a
    wrong weight on the train side is a wrong Megatron parameter, whatever checkpoint it came from).
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    cfg = HF_CONFIG
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    per_stage = cfg["num_hidden_layers"] // layout.pp
    pre, post = pp_rank == 0, pp_rank == layout.pp - 1
    with cpu_device():
        model = GPTModel(_transformer_config(layout, cfg),
                         _layer_spec(layout, cfg),
                         vocab_size=cfg["vocab_size"],
                         max_sequence_length=cfg["max_position_embeddings"],
                         pre_process=pre, post_process=post,
                         share_embeddings_and_output_weights=False,
                         position_embedding_type="rope", rotary_base=int(cfg["rope_theta"]))
    state = convert(model_state(hf_model), cfg, tp_rank, layout.tp,
                    range(pp_rank * per_stage, (pp_rank + 1) * per_stage), pre, post, qkv_order)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise RuntimeError(f"conversion mismatch: missing {missing}, unexpected {unexpected}")
    model.eval()
    for fault in faults:
        fault(model, layout)
    return model


def model_state(hf_model):
    """A detached copy of an HF model's state dict (fp32)."""
    return {k: v.detach().clone().float() for k, v in hf_model.state_dict().items()}


def stage_forward(layout: Layout, model, input_ids):
    """One forward of this rank's stage on ``input_ids`` [b, s].

    Stage 0 sends its output hidden states [s, b, h] to the next stage; a later stage receives
    them first and feeds them in with ``set_input_tensor``.  Returns this rank's vocab shard of
    the logits [b, s, v/tp] on the last stage, None elsewhere.
    """
    from megatron.core import parallel_state

    b, s = input_ids.shape
    positions = torch.arange(s).unsqueeze(0).expand(b, s)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    with cpu_device(), torch.no_grad():
        comm = _communicator(model) if layout.pp > 1 else None
        if pp_rank > 0:
            shape = (s // layout.tp if layout.sp else s, b, HF_CONFIG["hidden_size"])
            model.set_input_tensor(comm.recv_forward(shape, is_first_stage=False))
        out = model(input_ids if pp_rank == 0 else None, positions, mask)
        if pp_rank < layout.pp - 1:
            comm.send_forward(out, is_last_stage=False)
            return None
    return out


def _communicator(model):
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

    return P2PCommunicator(pp_group=parallel_state.get_pipeline_model_parallel_group(),
                           config=model.config)


def gather_logits(layout: Layout, logits):
    """Full-vocabulary logits from this rank's vocab shard (all-gather over the TP group)."""
    from megatron.core import parallel_state

    if layout.tp == 1:
        return logits
    parts = [torch.empty_like(logits) for _ in range(layout.tp)]
    torch.distributed.all_gather(parts, logits.contiguous(),
                                 group=parallel_state.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank, layout, port, fn, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=layout.world)
    try:
        _init_parallel(layout)
        fn(layout, *args)
    finally:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def run_ranks(layout: Layout, fn, *args) -> None:
    """Run ``fn(layout, *args)`` in ``layout.world`` processes joined over gloo (also for 1 rank,
    so that every case sees the same process setup).  ``fn`` must be a module-level function."""
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(layout, _free_port(), fn, args), nprocs=layout.world, join=True)
