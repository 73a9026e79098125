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
  call whatever the config says, the pipeline communicator allocates its receive buffers there,
  and so does ``DistributedDataParallel`` its gradient buffers.  No flag avoids any of them; with
  the patch they land on the CPU and nothing else changes.

msprobe notices megatron-core on import and wraps ``schedules.forward_step``/``backward_step``
(for its backward hooks under pipelining); forward-only dumps made without the schedules do not
go through those wrappers.

Pipeline parallelism: the two stages run in two processes; stage 0 sends its hidden states with
megatron-core's own ``P2PCommunicator.send_forward`` and stage 1 receives them with
``recv_forward`` and feeds them through ``set_input_tensor`` (what ``forward_step`` does inside
megatron's schedules).  The schedules themselves are not used: they need a loss function and a
data iterator and add nothing a forward-only dump shows.

Public API:
    HF_CONFIG                                  the tiny Llama config (dict for LlamaConfig)
    hf_config(vocab_size, layers) -> LlamaConfig
    make_hf_llama(seed, vocab_size, layers) -> LlamaForCausalLM   fp32, eval mode, fixed seed
    num_layers(hf_state) -> int                the decoder layers an HF state dict holds
    megatron_lm_padded_vocab(vocab, tp) -> int  the vocabulary Megatron-LM builds for ``vocab``
    Layout(tp, pp, sp, vp)                     one job layout; ``world`` = tp * pp; ``vp`` model
                                               chunks per pipeline rank (virtual pipeline)
    Conversion(qkv_order, wrong_gate_shard, padded_vocab)   how HF weights become Megatron's
    convert(hf_state, cfg, tp_rank, tp, layers, pre, post, conversion) -> state dict
    init_parallel(layout)                      Megatron's parallel state on the gloo world
    build_stage(layout, hf_state, conversion, vp_stage) -> GPTModel of this rank (one chunk)
    build_chunks(layout, hf_state, conversion) -> [GPTModel]   this rank's model chunks
    stage_forward(layout, model, input_ids) -> logits on the last stage (vocab shard), else None
    chunks_forward(layout, chunks, input_ids)  the same through virtual-pipeline chunks
    gather_logits(layout, logits) -> full-vocab logits [b, s, v] (TP all-gather, for checking)
    check_against_hf(layout, hf_state, ids)    the conversion check (fp32 logits equal HF's)
    as_megatron_lm(model) -> [DDP(Float16Module(model))]   the bf16 training wrappers
    train_rank(...), rollout_rank(...)         ``msprobe_run.run_ranks`` targets: one rank's dump
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

HF_CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                 rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                 hidden_act="silu", attention_bias=False, mlp_bias=False,
                 attn_implementation="eager")

QKV_ORDERS = ("interleaved", "plain")


@dataclass(frozen=True)
class Conversion:
    """How the HF weights are laid out for Megatron.

    ``qkv_order="plain"`` stacks [q; k; v] (the classic conversion bug);
    ``wrong_gate_shard=(layer, rank, from_rank)`` makes TP rank ``rank`` load the gate rows of
    ``from_rank`` into layer ``layer``'s fc1 shard (one wrong shard on one rank);
    ``padded_vocab`` pads the embedding and output rows as Megatron-LM's checkpoint converter
    does (copies of the last row).
    """

    qkv_order: str = "interleaved"
    wrong_gate_shard: tuple[int, int, int] | None = None
    padded_vocab: int | None = None


@dataclass(frozen=True)
class Layout:
    """One Megatron job layout: tensor-parallel size, pipeline size, sequence parallel."""

    tp: int = 1
    pp: int = 1
    sp: bool = False
    vp: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.pp


def hf_config(vocab_size: int = HF_CONFIG["vocab_size"], layers: int = HF_CONFIG["num_hidden_layers"]):
    """The tiny Llama config as a ``transformers.LlamaConfig``."""
    from transformers import LlamaConfig

    return LlamaConfig(**{**HF_CONFIG, "vocab_size": vocab_size, "num_hidden_layers": layers})


def num_layers(hf_state) -> int:
    """The number of decoder layers an HF Llama state dict holds."""
    return 1 + max(int(k.split(".")[2]) for k in hf_state if k.startswith("model.layers."))


def megatron_lm_padded_vocab(vocab: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron-LM's vocabulary size for a tokenizer of ``vocab``: rounded up to a multiple of
    ``make_vocab_size_divisible_by`` (default 128) times the TP size."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def _vocab(hf_state) -> int:
    return hf_state["model.embed_tokens.weight"].shape[0]


def make_hf_llama(seed: int = 0, vocab_size: int = HF_CONFIG["vocab_size"],
                  layers: int = HF_CONFIG["num_hidden_layers"]):
    """The tiny HF Llama every Megatron case converts from (fp32, eval, weights from ``seed``).

    Weights are redrawn with std 0.1 (the default 0.02 leaves activations near 1e-3 after two
    layers) and norm weights around 1, so that a wrong norm weight shows too.
    """
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(hf_config(vocab_size, layers)).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 if "norm" in name else 0.0) + 0.1 * torch.randn(p.shape, generator=gen))
    return model


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


def _pad_rows(t, rows):
    if rows is None or rows == t.shape[0]:
        return t
    return torch.cat([t, t[-1:].expand(rows - t.shape[0], -1)], dim=0)


def convert(hf_state, cfg, tp_rank, tp, layers, pre, post, conversion=Conversion()):
    """HF Llama state dict -> the local state dict of one Megatron rank.

    ``layers`` are the global layer numbers this pipeline stage holds; they become local indices
    0.. (Megatron numbers a stage's modules from 0).  Column-parallel weights (qkv, fc1, output
    layer, vocab embedding) keep rows of this TP rank, row-parallel ones (proj, fc2) columns.
    """
    if conversion.qkv_order not in QKV_ORDERS:
        raise ValueError(f"qkv_order must be one of {QKV_ORDERS}")
    wrong = conversion.wrong_gate_shard
    out = {}
    if pre:
        out["embedding.word_embeddings.weight"] = _rows(
            _pad_rows(hf_state["model.embed_tokens.weight"], conversion.padded_vocab), tp_rank, tp)
    for local, layer in enumerate(layers):
        src, dst = f"model.layers.{layer}", f"decoder.layers.{local}"
        out[f"{dst}.input_layernorm.weight"] = hf_state[f"{src}.input_layernorm.weight"]
        out[f"{dst}.pre_mlp_layernorm.weight"] = hf_state[f"{src}.post_attention_layernorm.weight"]
        out[f"{dst}.self_attention.linear_qkv.weight"] = _rows(
            _qkv_rows(hf_state, f"{src}.self_attn", cfg, conversion.qkv_order), tp_rank, tp)
        out[f"{dst}.self_attention.linear_proj.weight"] = _cols(
            hf_state[f"{src}.self_attn.o_proj.weight"], tp_rank, tp)
        # fc1 is column-parallel over a fused [gate; up]: rank r holds [gate_r; up_r]
        gate_rank = wrong[2] if wrong and wrong[:2] == (layer, tp_rank) else tp_rank
        out[f"{dst}.mlp.linear_fc1.weight"] = torch.cat(
            [_rows(hf_state[f"{src}.mlp.gate_proj.weight"], gate_rank, tp),
             _rows(hf_state[f"{src}.mlp.up_proj.weight"], tp_rank, tp)], dim=0)
        out[f"{dst}.mlp.linear_fc2.weight"] = _cols(hf_state[f"{src}.mlp.down_proj.weight"], tp_rank, tp)
    if post:
        out["decoder.final_layernorm.weight"] = hf_state["model.norm.weight"]
        out["output_layer.weight"] = _rows(_pad_rows(hf_state["lm_head.weight"], conversion.padded_vocab),
                                           tp_rank, tp)
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
    return TransformerBlockSubmodules(layer_specs=[layer] * (cfg["num_hidden_layers"] // layout.pp // layout.vp),
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
        virtual_pipeline_model_parallel_size=layout.vp if layout.vp > 1 else None,
        sequence_parallel=layout.sp, params_dtype=torch.float32, pipeline_dtype=torch.float32,
        use_cpu_initialization=True, bias_activation_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
        batch_p2p_comm=False)


def init_parallel(layout: Layout) -> None:
    """Megatron's parallel state on the already initialised gloo world (TP inner, PP outer)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vp if layout.vp > 1 else None)
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


def stage_layers(layout: Layout, layers: int = HF_CONFIG["num_hidden_layers"], vp_stage: int | None = None) -> range:
    """The global layer numbers this process's pipeline stage (its chunk ``vp_stage``) holds.

    With a virtual pipeline, chunk c of pipeline rank p starts at c * layers / vp + p * layers /
    (vp * pp) (megatron-core's ``get_transformer_layer_offset`` for uniform stages)."""
    from megatron.core import parallel_state

    per_chunk = layers // layout.pp // layout.vp
    first = (vp_stage or 0) * (layers // layout.vp) + parallel_state.get_pipeline_model_parallel_rank() * per_chunk
    return range(first, first + per_chunk)


def build_stage(layout: Layout, hf_state, conversion=Conversion(), vp_stage: int | None = None):
    """The GPTModel of this process's rank (chunk ``vp_stage`` of it, eval mode), loaded from the
    HF state dict."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    cfg = {**HF_CONFIG, "num_hidden_layers": num_layers(hf_state)}
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    chunk = vp_stage or 0
    pre, post = pp_rank == 0 and chunk == 0, pp_rank == layout.pp - 1 and chunk == layout.vp - 1
    with cpu_device():
        model = GPTModel(_transformer_config(layout, cfg), _layer_spec(layout, cfg),
                         vocab_size=conversion.padded_vocab or _vocab(hf_state),
                         max_sequence_length=cfg["max_position_embeddings"],
                         pre_process=pre, post_process=post,
                         share_embeddings_and_output_weights=False,
                         position_embedding_type="rope", rotary_base=int(cfg["rope_theta"]),
                         vp_stage=vp_stage)
    state = convert(hf_state, cfg, parallel_state.get_tensor_model_parallel_rank(), layout.tp,
                    stage_layers(layout, cfg["num_hidden_layers"], vp_stage), pre, post, conversion)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise RuntimeError(f"conversion mismatch: missing {missing}, unexpected {unexpected}")
    return model.eval()


def build_chunks(layout: Layout, hf_state, conversion=Conversion()):
    """This rank's model chunks: one GPTModel, or ``layout.vp`` of them under a virtual pipeline."""
    if layout.vp == 1:
        return [build_stage(layout, hf_state, conversion)]
    return [build_stage(layout, hf_state, conversion, c) for c in range(layout.vp)]


def model_state(hf_model):
    """A detached fp32 copy of an HF model's state dict."""
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


def chunks_forward(layout: Layout, chunks, input_ids):
    """One forward through this rank's model chunks in the interleaved order: chunk c of every
    stage before chunk c + 1 of the first, the last stage's chunk c feeding the first stage's
    chunk c + 1 (what the interleaved schedule does for one micro-batch).  Activations go rank to
    rank with plain send/recv.  Returns the logits shard on the last stage, None elsewhere."""
    if layout.vp == 1:
        return stage_forward(layout, chunks[0], input_ids)
    from megatron.core import parallel_state

    b, s = input_ids.shape
    positions = torch.arange(s).unsqueeze(0).expand(b, s)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    prev = parallel_state.get_pipeline_model_parallel_prev_rank()
    nxt = parallel_state.get_pipeline_model_parallel_next_rank()
    shape = (s // layout.tp if layout.sp else s, b, HF_CONFIG["hidden_size"])
    out = None
    with cpu_device(), torch.no_grad():
        for c, model in enumerate(chunks):
            first = c == 0 and pp_rank == 0
            last = c == layout.vp - 1 and pp_rank == layout.pp - 1
            if not first:
                received = torch.empty(shape)
                torch.distributed.recv(received, src=prev)
                model.set_input_tensor(received)
            out = model(input_ids if first else None, positions, mask)
            if not last:
                torch.distributed.send(out.contiguous(), dst=nxt)
    return out if pp_rank == layout.pp - 1 else None


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


def global_name(name: str, layers: range) -> str:
    """A stage-local module name with its layer index made global (``decoder.layers.0`` of the
    second stage is layer ``len(layers)`` of the model)."""
    parts = name.split(".")
    if len(parts) > 2 and parts[:2] == ["decoder", "layers"]:
        parts[2] = str(layers[int(parts[2])])
    return ".".join(parts)


def _probe(out, mode):
    """An msprobe debugger writing into ``out`` (given to msprobe as a path relative to its
    parent, so that dump.json's ``dump_data_dir`` does not depend on where the corpus lives)."""
    from . import msprobe_run

    out = Path(out)
    os.chdir(out.parent)
    task, summary = ("statistics", "md5") if mode == "md5" else (mode, "statistics")
    return msprobe_run.Probe(out.name, task, summary)


def check_against_hf(layout, hf_state, ids, padded_vocab=None, tolerance=1e-5):
    """Raise unless the fp32 GPTModel converted from ``hf_state`` gives HF's logits for ``ids``
    (on the last stage, padding rows left out; every rank takes part in the forward)."""
    from transformers import LlamaForCausalLM

    logits = chunks_forward(layout, build_chunks(layout, hf_state, Conversion(padded_vocab=padded_vocab)), ids)
    if logits is None:
        return
    full = gather_logits(layout, logits)[..., :_vocab(hf_state)]
    hf = LlamaForCausalLM(hf_config(_vocab(hf_state), num_layers(hf_state))).eval()
    hf.load_state_dict(hf_state)
    with torch.no_grad():
        err = float((full - hf(input_ids=ids).logits).abs().max())
    if err > tolerance:
        raise RuntimeError(f"rank {torch.distributed.get_rank()}: GPTModel logits differ from HF by {err:.3g}")


def as_megatron_lm(model):
    """The model as Megatron-LM's training loop holds it in bf16: ``DistributedDataParallel`` over
    ``Float16Module`` (module names gain ``module.module.``), in the list of model chunks that
    msprobe is started on (names gain the list index)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer.module import Float16Module

    model.config.bf16 = True
    with cpu_device():  # the DDP grad buffers are allocated on the current device
        return [DistributedDataParallel(model.config, DistributedDataParallelConfig(),
                                        Float16Module(model.config, model))]


def train_rank(layout, mode, dtype, conversion, state, clean_state, ids, out, scratch):
    """``msprobe_run.run_ranks`` target: one rank of the Megatron train forward under msprobe.

    Checks the clean fp32 conversion against HF first, then dumps the forward of ``state``
    converted by ``conversion`` (``dtype`` "bf16": wrapped as Megatron-LM wraps it) in msprobe
    ``mode`` (statistics, tensor or md5) into ``out``.  Module outputs (global names) of that run
    and of a clean run in the same dtype go to ``scratch/train_rank<r>.pt`` for measuring.
    """
    from .sides import Capture

    init_parallel(layout)
    try:
        check_against_hf(layout, clean_state, ids, conversion.padded_vocab)
        total = num_layers(clean_state)

        def run(weights, conv, probe=None):
            chunks = build_chunks(layout, weights, conv)
            if dtype == "bf16":
                started = [w for m in chunks for w in as_megatron_lm(m)]
                outer = started
            else:  # a virtual pipeline is a list of chunks to msprobe (names gain the list index)
                started = chunks if layout.vp > 1 else chunks[0]
                outer = chunks
            caps = [Capture(m) for m in chunks]
            if probe:
                probe.forward(started, lambda: chunks_forward(layout, outer, ids))
            else:
                chunks_forward(layout, outer, ids)
            out = {}
            for c, cap in enumerate(caps):
                layers = stage_layers(layout, total, c if layout.vp > 1 else None)
                out.update({global_name(k, layers): v for k, v in cap.stop().items()})
            return out

        caps = {"dumped": run(state, conversion, _probe(out, mode))}
        caps["clean"] = run(clean_state, Conversion(padded_vocab=conversion.padded_vocab))
        torch.save(caps, Path(scratch) / f"train_rank{torch.distributed.get_rank()}.pt")
    finally:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()


def rollout_rank(mode, dtype, state, clean_state, prompt, new_tokens, out, scratch):
    """``msprobe_run.run_ranks`` target: one rank of a vllm_like generation of ``new_tokens``
    tokens from ``prompt`` under msprobe (prefill ``step0``, one step per decoded token); in bf16
    with the fused RMSNorm kernel (rounds once, as vLLM's CUDA kernel).  Rank 0 writes the sampled
    tokens to ``scratch/tokens.json``; prefill outputs of that run and of a clean one go to
    ``scratch/rollout_rank<r>.pt``."""
    from . import dist, vllm_like
    from .sides import Capture

    def run(weights, probe=None, steps=1):
        opts = {"rms_kernel": "fused"} if dtype == "bf16" else {}
        model = vllm_like.build(hf_config(_vocab(weights), num_layers(weights)), torch.bfloat16 if dtype == "bf16" else torch.float32, **opts)
        model.load_weights(weights)
        cap = Capture(model)
        tokens = vllm_like.generate(model, prompt, steps, probe.step_scope(model) if probe else None)
        return cap.stop(), tokens

    dumped, tokens = run(state, _probe(out, mode), new_tokens)
    caps = {"dumped": dumped, "clean": run(clean_state)[0]}
    torch.save(caps, Path(scratch) / f"rollout_rank{dist.rank()}.pt")
    if dist.rank() == 0:
        (Path(scratch) / "tokens.json").write_text(json.dumps(tokens))
