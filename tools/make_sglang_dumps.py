"""Write real SGLang-dumper dumps of a tiny Llama run, and msprobe dumps of the same run.

Not used by the tests (they read what this wrote, committed under tests/data/real_sglang/); rerun
it to regenerate them. Needs torch (CPU) and transformers, mindstudio-probe for the msprobe
copies, and an SGLang wheel, whose ``sglang/srt/debug_utils/dumper.py`` is imported as a single
file (nothing of SGLang is copied here or committed):

    pip download sglang==0.5.23 --no-deps -d /tmp/sgl
    python tools/make_sglang_dumps.py --wheel /tmp/sgl/sglang-0.5.23-*.whl OUT

The dumper's other imports (ZMQ and SGLang's runtime context, used only by its HTTP control and
its in-server plugin) are replaced by empty stand-ins, so the dumper runs as it does in a plain
training script: the SGLang plugin is absent and the Megatron one reports that no parallel state
is set up. Runs, each in its own process (the dumper and msprobe are process-wide singletons):

* ``OUT/dumper/train``: HF ``LlamaForCausalLM`` (fixed seed), non-intrusive mode ``all`` plus
  ``dump_model`` (the parameters), one forward, one step;
* ``OUT/dumper/rollout``: the same weights in the vLLM-structured re-creation of
  ``tools/real_dumps/vllm_like.py`` (fused qkv/gate_up, add+norm, token-first), with
  ``model.layers.1.mlp.down_proj.weight`` stale (the weight before the last update), same
  tokens;
* ``OUT/named/{train,rollout}``: the same two runs dumped by hand-written calls
  ``dumper.dump(name, x, layer_id=i, dims=...)`` with the same names on both sides, as the Miles
  framework does;
* ``OUT/msprobe/{train,rollout}``: the same two runs dumped by msprobe (statistics, L0);
* ``OUT/gen/{rollout,train}``: the rollout (one rank) generating 3 tokens greedily with a dumper
  step per engine forward (step 0 the 8-token prefill, steps 1 and 2 one token each), and the
  train forward over the 10 tokens the rollout saw (``OUT/gen/tokens.json``); no parameters, and
  only the MLPs, the embedding and the logits (the dumper's ``filter``);
* ``OUT/bad/``: files named as the dumper names them that hold something else (a dict of
  tensors, a pickle calling ``os.system``, a name leading out of the folder), an archive the
  dumper left unfinished when torch.save failed on a value, and a value dumped again as a
  recomputed forward (``recompute/``);
* ``OUT/old/`` (with ``--old-wheel``, e.g. 0.5.2): the HF run dumped by hand with a dumper from
  before 0.5.9, which saves bare tensors and counts ``forward_pass_id``, over two forwards.

The rollout runs on ``--tp`` ranks (default 2, gloo), so its folders hold one ``rank`` tag per
rank (dumper) or one ``rank<r>`` folder per rank (msprobe).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DUMPER_MEMBER = "sglang/srt/debug_utils/dumper.py"
RUNS = ("dumper/train", "dumper/rollout", "named/train", "named/rollout", "msprobe/train", "msprobe/rollout",
        "gen/rollout", "gen/train")   # gen/train reads the tokens gen/rollout generated
TOKENS = [1, 5, 9, 3, 7, 2, 11, 4]
FAULT = "model.layers.1.mlp.down_proj.weight"
GEN_TOKENS = 3


def _stub(name: str, **attrs) -> None:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod


def import_dumper(wheel: Path, out: Path, exp_name: str, mode: str = "all", only: str | None = None):
    """The dumper singleton of the wheel's dumper.py, configured to write ``out/<exp_name>``
    (with ``only``, the dumper's own filter keeps the names this regex finds)."""
    with zipfile.ZipFile(wheel) as zf:
        source = zf.read(DUMPER_MEMBER)
    tmp = Path(tempfile.mkdtemp(prefix="sgl_dumper_"))
    (tmp / "sgl_dumper.py").write_bytes(source)
    for name in ("zmq", "sglang", "sglang.srt", "sglang.srt.managers"):
        _stub(name)
    _stub("sglang.srt.managers.io_struct", sock_recv=None, sock_send=None, wrap_as_pickle=None)
    _stub("sglang.srt.runtime_context", get_parallel=None, get_server_args=None, get_serving=None)
    _stub("sglang.srt.utils", get_device=lambda: "cpu")
    os.environ.update(DUMPER_ENABLE="1", DUMPER_DIR=str(out), DUMPER_EXP_NAME=exp_name,
                      DUMPER_NON_INTRUSIVE_MODE=mode, DUMPER_ENABLE_OUTPUT_CONSOLE="0",
                      DUMPER_ENABLE_MODEL_VALUE="1")
    if only:
        os.environ["DUMPER_FILTER"] = f"search({only!r}, name) is not None"
    spec = importlib.util.spec_from_file_location("sgl_dumper", tmp / "sgl_dumper.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sgl_dumper"] = module   # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    shutil.rmtree(tmp)
    return module.dumper


def _hf_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval()


def _stale(model) -> None:
    """Set the fault weight back to what it was before a last optimizer update."""
    import torch

    w = dict(model.named_parameters())[FAULT]
    update = 0.05 * torch.randn(w.shape, generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        w.sub_(update)


def _rollout_model():
    """This TP rank's vLLM-structured model, loaded from the HF weights with the fault planted."""
    from real_dumps import vllm_like   # tools/real_dumps (branch corpus)

    hf = _hf_model()
    _stale(hf)
    model = vllm_like.build(hf.config)
    model.load_weights(dict(hf.state_dict()))
    return model.eval()


def _forward(side: str, model) -> None:
    """One training forward (HF, [batch, seq]) or one engine forward (token-first ids, positions)."""
    import torch

    ids = torch.tensor(TOKENS)
    with torch.no_grad():
        if side == "train":
            model(input_ids=ids[None])
        else:
            model.compute_logits(model(ids, torch.arange(len(TOKENS))))


def _named_hooks(dumper, model, side: str) -> None:
    """Hand-written dumps of the residual stream entering each layer, the attention heads entering
    o_proj, each layer's MLP output and the final norm's output, named alike on both sides and
    annotated with their dims."""
    token_first = side == "rollout"
    dims = "t h" if token_first else "b s h"

    def at_layer_start(i):
        def hook(_mod, args, kwargs):
            if token_first:   # vLLM layers take (positions, hidden, residual): the stream is their sum
                hidden, residual = args[1], args[2]
                stream = hidden if residual is None else hidden + residual
            else:
                stream = args[0] if args else kwargs["hidden_states"]
            dumper.dump("layer_start__hidden_states", stream, layer_id=i, dims=dims)
        return hook

    def before_o_proj(i):
        # The attention heads entering o_proj: split over TP ranks on the rollout (RowParallelLinear).
        heads = "t (num_heads*head_dim)[tp]" if token_first else "b s (num_heads*head_dim)"

        def hook(_mod, args):
            dumper.dump("attn_core_output", args[0], layer_id=i, dims=heads)
        return hook

    def after_mlp(i):
        def hook(_mod, _args, output):
            dumper.dump("mlp_output", output, layer_id=i, dims=dims)
        return hook

    for i, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(at_layer_start(i), with_kwargs=True)
        layer.self_attn.o_proj.register_forward_pre_hook(before_o_proj(i))
        layer.mlp.register_forward_hook(after_mlp(i))

    def final(_mod, _args, output):
        dumper.dump("final_norm__hidden_states", output[0] if isinstance(output, tuple) else output, dims=dims)
    model.model.norm.register_forward_hook(final)


def _one_rank(wheel: Path, out: Path, kind: str, side: str) -> None:
    model = _hf_model() if side == "train" else _rollout_model()
    if kind == "msprobe":
        from real_dumps.msprobe_run import Probe   # tools/real_dumps (branch corpus)
        Probe(str(out / kind / side)).forward(model, lambda: _forward(side, model))
        return
    dumper = import_dumper(wheel, out / kind, side, mode="all" if kind == "dumper" else "off")
    if kind == "dumper":
        dumper.register_non_intrusive_dumper(model)
        _forward(side, model)
        # vLLM/SGLang parameters carry a bound ``weight_loader``: torch.save would pickle the whole
        # module with them (the dumper then leaves a file without data.pkl), so drop it first.
        for p in model.parameters():
            p.__dict__.pop("weight_loader", None)
        dumper.dump_model(model)
    else:
        _named_hooks(dumper, model, side)
        _forward(side, model)
    dumper.step()


def _generation(wheel: Path, out: Path, side: str) -> None:
    """The rollout generating GEN_TOKENS tokens greedily, one dumper step per engine forward
    (step 0 the prefill, then one per decoded token); the train side's forward over the prompt and
    the tokens the rollout fed back."""
    import json

    import torch

    tokens = out / "gen" / "tokens.json"
    # The dumper's filter keeps the files few: the MLPs, the embedding and the logits.
    dumper = import_dumper(wheel, out / "gen", side, only=r"mlp|embed_tokens|logits|lm_head")
    model = _hf_model() if side == "train" else _rollout_model()
    dumper.register_non_intrusive_dumper(model)
    if side == "rollout":
        from real_dumps import vllm_like

        @contextlib.contextmanager
        def one_step(_i):
            yield
            dumper.step()

        new = vllm_like.generate(model, TOKENS, GEN_TOKENS, step_scope=one_step)
        tokens.write_text(json.dumps(TOKENS + new[:-1]))   # the last sampled token is never fed back
        return
    with torch.no_grad():
        model(input_ids=torch.tensor([json.loads(tokens.read_text())]))
    dumper.step()


def run_one(wheel: Path, out: Path, run: str, tp: int) -> None:
    """One run: the train side in this process, the rollout side on ``tp`` ranks (gloo)."""
    sys.path.insert(0, str(ROOT / "tools"))
    from real_dumps.msprobe_run import run_ranks, stable_proc_names

    kind, side = run.split("/")
    if kind == "gen":   # one rollout rank: a generation's steps are what this run shows
        run_ranks(_generation, 0 if side == "train" else 1, wheel, out, side)
        return
    run_ranks(_one_rank, 0 if side == "train" else tp, wheel, out, kind, side)
    if kind == "msprobe":
        stable_proc_names(out / kind / side)


class _RunsCode:
    """Pickles as a call of os.system: what a hostile file would hold."""

    def __reduce__(self):
        return os.system, ("true",)


def bad_inputs(wheel: Path, out: Path) -> None:
    """Files named as the dumper names them that the loader must refuse (and one it must skip)."""
    import threading

    import torch

    name = "step=0___rank=0___dump_index=1___name=x___recompute_status=disabled.pt"
    meta = {"step": 0, "rank": 0, "dump_index": 1, "name": "x", "recompute_status": "disabled"}
    value = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    for case, obj in (("not_a_record", {"a": value, "b": value}),
                      ("hostile", {"value": _RunsCode(), "meta": meta}),
                      ("path_name", {"value": value, "meta": {**meta, "name": "../../outside/x"}})):
        (out / "bad" / case).mkdir(parents=True)
        torch.save(obj, out / "bad" / case / name)
    # The dumper itself leaves an archive without data.pkl when torch.save fails on a value.
    dumper = import_dumper(wheel, out / "bad", "unfinished", mode="off")
    dumper.dump("hidden", value, layer_id=0)
    dumper.dump("state", {"lock": threading.Lock()}, layer_id=0)
    dumper.step()
    # A forward dumped again while activation checkpointing recomputes it: the status Megatron's
    # plugin would report (no Megatron parallel state here) is given to the dumper's own detector.
    dumper = import_dumper(wheel, out / "bad", "recompute", mode="off")
    module = sys.modules["sgl_dumper"]
    dumper.dump("hidden", value, layer_id=0)
    module._detect_recompute_status = lambda: module._RecomputeStatus.RECOMPUTE
    dumper.dump("hidden", value * 2, layer_id=0)
    dumper.step()


def old_format(wheel: Path, out: Path) -> None:
    """The HF train run dumped by hand with an old dumper (bare tensors, ``forward_pass_id``),
    over two forward passes."""
    import torch

    with zipfile.ZipFile(wheel) as zf:
        source = zf.read(DUMPER_MEMBER)
    tmp = Path(tempfile.mkdtemp(prefix="sgl_dumper_old_"))
    (tmp / "sgl_dumper_old.py").write_bytes(source)
    os.environ.update(SGLANG_DUMPER_ENABLE="1", SGLANG_DUMPER_DIR=str(out / "old"))
    spec = importlib.util.spec_from_file_location("sgl_dumper_old", tmp / "sgl_dumper_old.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shutil.rmtree(tmp)
    dumper, model = module.dumper, _hf_model()
    for i, layer in enumerate(model.model.layers):
        layer.mlp.register_forward_hook(lambda _m, _a, y, i=i: dumper.dump("mlp_output", y, layer_id=i))
    with torch.no_grad():
        for ids in (TOKENS, TOKENS[:4]):
            dumper.on_forward_pass_start()
            model(input_ids=torch.tensor([ids]))
    # It names its folder after the clock (sglang_dump_<time>): a fixed name keeps paths stable.
    for folder in (out / "old").glob("sglang_dump_*"):
        folder.rename(folder.with_name("sglang_dump_0"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder to write dumper/, named/, msprobe/ into (replaced)")
    ap.add_argument("--wheel", required=True, help="an SGLang wheel (pip download sglang --no-deps)")
    ap.add_argument("--old-wheel", help="an SGLang wheel from before 0.5.9 (e.g. 0.5.2) for OUT/old/")
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks of the rollout (default 2)")
    ap.add_argument("--run", choices=RUNS + ("bad", "old"), help=argparse.SUPPRESS)   # one run, in a child process
    args = ap.parse_args(argv)
    wheel, out = Path(args.wheel), Path(args.out)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"error: {exc.name} is not installed (pip install torch transformers)", file=sys.stderr)
        return 2
    for w in filter(None, (wheel, args.old_wheel)):
        if not zipfile.is_zipfile(w) or DUMPER_MEMBER not in zipfile.ZipFile(w).namelist():
            print(f"error: {w}: not a wheel holding {DUMPER_MEMBER}", file=sys.stderr)
            return 2
    if args.run == "bad":
        bad_inputs(wheel, out)
    elif args.run == "old":
        old_format(wheel, out)
    elif args.run:
        run_one(wheel, out, args.run, args.tp)
    if args.run:
        return 0
    for kind in ("dumper", "named", "msprobe", "gen", "bad", "old"):
        shutil.rmtree(out / kind, ignore_errors=True)
    runs = RUNS + ("bad",) + (("old",) if args.old_wheel else ())
    for run in runs:
        subprocess.run([sys.executable, __file__, str(out), "--wheel", str(args.old_wheel if run == "old" else wheel),
                        "--tp", str(args.tp), "--run", run], check=True)
    print(f"wrote {out}/{{dumper,named,msprobe,gen}}/{{train,rollout}}, {out}/bad/"
          + (f", {out}/old/" if args.old_wheel else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
