"""Hostile and broken inputs, round two (issue 28), run as a user runs the compare script.

Links are built in a tmp folder beside small committed dumps. An outside file holds a canary
(a module name, or a marker in a config): the run must refuse with one line naming the link or
file and exit 2, the canary must appear in no output, and --out-dir must not be created.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPARE = ROOT / "dump-module-mapping-value-compare" / "scripts" / "run_compare.py"
STATS = ROOT / "tests" / "data" / "msprobe" / "llama_L0_statistics"
PERTURBED = ROOT / "tests" / "data" / "msprobe" / "llama_L0_statistics_perturbed"
REAL = ROOT / "tests" / "data" / "real" / "llama_tp1_fp32_clean"
MODEL = ROOT / "tests" / "data" / "real" / "_models" / "llama"
DUMPER = ROOT / "tests" / "data" / "real_sglang" / "dumper"
NAMED = ROOT / "tests" / "data" / "real_sglang" / "named" / "rollout"
CANARY = "canarysecret7731"
DUMP = Path("step0") / "proc0" / "dump.json"


def run(*args: str | Path, cwd: Path) -> tuple[int, str, str]:
    """run_compare.py in a subprocess: (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, str(COMPARE), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


def refused(tmp: Path, args: list, names: str, *words: str) -> str:
    """Run, and check the refusal: exit 2, one line naming ``names``, no canary, no --out-dir."""
    rc, out, err = run(*args, "--out-dir", tmp / "out", cwd=tmp)
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith(f"error: {names}:") and "internal error" not in err, err
    for w in words:
        assert w in err, err
    assert CANARY not in out + err and out == ""
    assert not (tmp / "out").exists()
    return err


def canary_dump(folder: Path) -> Path:
    """Another run's dump.json whose modules carry the canary in their names."""
    folder.mkdir(parents=True, exist_ok=True)
    text = (PERTURBED / DUMP).read_text(encoding="utf-8").replace("Module.model.", f"Module.{CANARY}.model.")
    (folder / "dump.json").write_text(text, encoding="utf-8")
    return folder / "dump.json"


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    shutil.copytree(STATS, tmp_path / "train")
    (tmp_path / "rollout" / DUMP.parent).mkdir(parents=True)
    return tmp_path


# ---------------------------------------------------------------------------------------------
# item 1: links out of the dump folder


def test_dump_json_linked_out_of_the_folder_is_refused(tmp):
    (tmp / "rollout" / DUMP).symlink_to(canary_dump(tmp / "elsewhere"))
    refused(tmp, ["--train", "train", "--rollout", "rollout"], f"rollout/{DUMP}", "leads outside the folder")


def test_step_folder_linked_out_of_the_folder_is_refused(tmp):
    canary_dump(tmp / "other_run" / "step0" / "proc0")
    shutil.rmtree(tmp / "rollout")
    (tmp / "rollout").mkdir()
    (tmp / "rollout" / "step0").symlink_to(tmp / "other_run" / "step0", target_is_directory=True)
    refused(tmp, ["--train", "train", "--rollout", "rollout"], "rollout/step0", "link leads outside")


def test_construct_json_linked_out_of_the_folder_is_refused(tmp):
    shutil.copy(PERTURBED / DUMP, tmp / "rollout" / DUMP)
    outside = tmp / "elsewhere" / "construct.json"
    outside.parent.mkdir()
    outside.write_text(json.dumps({f"Module.{CANARY}.Linear.forward.0": None}), encoding="utf-8")
    (tmp / "rollout" / DUMP.parent / "construct.json").symlink_to(outside)
    refused(tmp, ["--train", "train", "--rollout", "rollout"], f"rollout/{DUMP.parent}/construct.json",
            "leads outside the dump folder")


def test_sglang_dumper_file_linked_out_of_the_folder_is_refused(tmp):
    shutil.copytree(DUMPER / "train", tmp / "dtrain")
    shutil.copytree(DUMPER / "rollout", tmp / "drollout")
    victim = sorted((tmp / "drollout").glob("*.pt"))[3]
    victim.unlink()
    victim.symlink_to(next(NAMED.glob("*.pt")))
    err = refused(tmp, ["--train", "dtrain", "--rollout", "drollout"], f"drollout/{victim.name}", "leads outside")
    assert "attn_core_output" not in err and "layer_start" not in err   # the outside file's names


def test_links_that_stay_inside_and_a_linked_folder_on_the_command_line_are_read(tmp):
    shutil.copy(PERTURBED / DUMP, tmp / "rollout" / "real.data")
    (tmp / "rollout" / DUMP).symlink_to(Path("..") / ".." / "real.data")
    (tmp / "named_train").symlink_to(tmp / "train", target_is_directory=True)
    rc, out, err = run("--train", "named_train", "--rollout", "rollout", "--out-dir", tmp / "out", cwd=tmp)
    assert rc == 0, err
    doc4 = json.loads((tmp / "out" / "output_4_module_analysis.json").read_text(encoding="utf-8"))
    # The perturbed copy differs on model.layers.1.mlp.down_proj's weight: still found.
    assert "model.layers.1.mlp.down_proj" in doc4["first_divergence"]["train_modules"]


def test_link_loops_in_the_dump_folder_are_passed_over(tmp):
    shutil.copy(PERTURBED / DUMP, tmp / "rollout" / DUMP)
    (tmp / "rollout" / "loop").symlink_to("loop")                 # a folder-like loop
    (tmp / "rollout" / "step0" / "dump.json").symlink_to("dump.json")
    rc, _, err = run("--train", "train", "--rollout", "rollout", "--out-dir", tmp / "out", "--quiet", cwd=tmp)
    assert rc == 0, err
    doc1 = json.loads((tmp / "out" / "output_1_key_mapping.json").read_text(encoding="utf-8"))
    assert [f["path"] for f in doc1["sources"]["input_plan"]["sides"]["rollout"]["steps"][0]["files"]] == [
        f"rollout/{DUMP}"]


# ---------------------------------------------------------------------------------------------
# item 1: --model folders keep their links (Hugging Face cache), but not to devices or FIFOs


def hf_cache(tmp: Path) -> Path:
    """MODEL laid out as a Hugging Face cache snapshot: every file a link into ../../blobs."""
    repo = tmp / "hub" / "models--org--llama"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(MODEL.iterdir())):
        shutil.copy(f, repo / "blobs" / f"blob{i}")
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / f"blob{i}")
    return snap


def real_args(tmp: Path, model: Path) -> list:
    return ["--train", REAL / "train", "--rollout", REAL / "rollout", "--model", model]


def test_model_folder_of_links_into_blobs_is_read(tmp):
    snap = hf_cache(tmp)
    rc, _, err = run(*real_args(tmp, snap), "--out-dir", tmp / "out", "--quiet", cwd=tmp)
    assert rc == 0, err
    doc3 = json.loads((tmp / "out" / "output_3_value_compare.json").read_text(encoding="utf-8"))
    assert doc3["reference"] and any(r.get("reference") for r in doc3["results"])


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_model_file_linked_to_a_device_is_refused(tmp, name):
    snap = hf_cache(tmp)
    (snap / name).unlink()
    (snap / name).symlink_to("/dev/zero")
    refused(tmp, real_args(tmp, snap), str(snap / name), "a device or FIFO")


def test_model_config_that_is_a_fifo_is_refused(tmp):
    snap = hf_cache(tmp)
    (snap / "config.json").unlink()
    os.mkfifo(snap / "config.json")
    refused(tmp, real_args(tmp, snap), str(snap / "config.json"), "a device or FIFO")


# ---------------------------------------------------------------------------------------------
# item 5: what an input is, said plainly


def test_a_device_as_train_says_so(tmp):
    refused(tmp, ["--train", "/dev/null", "--rollout", "train"], "/dev/null", "--train is a device or FIFO")


def test_missing_shard_without_an_index_is_a_link_to_nothing(tmp):
    snap = hf_cache(tmp)
    (snap / "model.safetensors").resolve().unlink()
    err = refused(tmp, real_args(tmp, snap), str(snap / "model.safetensors"), "a link to nothing")
    assert "index" not in err


@pytest.mark.parametrize("header, note", [
    ({"task": "overflow_check"}, "task 'overflow_check': msprobe writes only the calls that overflowed"),
    ({"task": "grad_probe"}, "task 'grad_probe' is not a msprobe dump task"),
    ({"level": "L7"}, "level 'L7' is not a msprobe level (L0, L1, L2, mix)")])
def test_other_task_or_unknown_level_is_noted(tmp, header, note):
    doc = json.loads((PERTURBED / DUMP).read_text(encoding="utf-8"))
    (tmp / "rollout" / DUMP).write_text(json.dumps({**doc, **header}), encoding="utf-8")
    rc, _, err = run("--train", "train", "--rollout", "rollout", "--out-dir", tmp / "out", "--quiet", cwd=tmp)
    assert rc == 0, err
    doc1 = json.loads((tmp / "out" / "output_1_key_mapping.json").read_text(encoding="utf-8"))
    assert note in " ".join(doc1["sources"]["rollout"]["notes"])
    assert not any("task" in n or "level" in n for n in doc1["sources"]["train"]["notes"])


# ---------------------------------------------------------------------------------------------
# item 2: JSON nested too deeply is an input error naming the file, not an internal error

DEEP = "[" * 200_000 + "]" * 200_000


def test_deep_config_json_in_the_model_folder(tmp):
    snap = hf_cache(tmp)
    (snap / "config.json").unlink()
    (snap / "config.json").write_text('{"a": ' + DEEP + "}", encoding="utf-8")
    refused(tmp, real_args(tmp, snap), str(snap / "config.json"), "nested too deeply")


def test_deep_rollout_config(tmp):
    (tmp / "deep.json").write_text('{"a": ' + DEEP + "}", encoding="utf-8")
    refused(tmp, [*real_args(tmp, MODEL), "--rollout-config", "deep.json"], "deep.json", "nested too deeply")


def test_deep_safetensors_header(tmp):
    model = tmp / "model"
    shutil.copytree(MODEL, model)
    header = ('{"a": ' + DEEP + "}").encode()
    (model / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    refused(tmp, real_args(tmp, model), str(model / "model.safetensors"), "nested too deeply")


def test_deep_saved_plan(tmp):
    (tmp / "plan.json").write_text('{"schema_version": "2.0", "pairs": ' + DEEP + "}", encoding="utf-8")
    shutil.copytree(PERTURBED, tmp / "rollout", dirs_exist_ok=True)
    refused(tmp, ["--train", "train", "--rollout", "rollout", "--plan", "plan.json"], "plan.json",
            "nested too deeply")


@pytest.mark.parametrize("option, text, problem", [
    ("--naming", "a: " + "[" * 50_000 + "]" * 50_000 + "\n", "cannot read naming profile (nested too deeply)"),
    ("--tolerances", "a: " + "[" * 50_000 + "]" * 50_000 + "\n", "cannot read tolerances (nested too deeply)"),
    ("--token-ids", DEEP, "--token-ids is not a JSON list of integers")])
def test_deep_user_files(tmp, option, text, problem):
    (tmp / "deep.txt").write_text(text, encoding="utf-8")
    shutil.copytree(PERTURBED, tmp / "rollout", dirs_exist_ok=True)
    refused(tmp, ["--train", "train", "--rollout", "rollout", option, "deep.txt"], "deep.txt", problem)


def test_naming_file_that_is_a_device_is_not_read_forever(tmp):
    shutil.copytree(PERTURBED, tmp / "rollout", dirs_exist_ok=True)
    refused(tmp, ["--train", "train", "--rollout", "rollout", "--naming", "/dev/zero"], "/dev/zero",
            "cannot read naming profile (it is a device or FIFO)")


# ---------------------------------------------------------------------------------------------
# item 2: config values of the wrong type or range are one input error naming config.json and the field

TENSOR_PAIR = ROOT / "tests" / "data" / "real" / "llama_tp1_tensor_clean"


def edited_model(tmp: Path, **fields) -> Path:
    """MODEL copied to tmp with ``fields`` written over its config.json (NaN as JSON's NaN)."""
    model = tmp / "model"
    shutil.copytree(MODEL, model)
    config = json.loads((MODEL / "config.json").read_text(encoding="utf-8"))
    (model / "config.json").write_text(json.dumps({**config, **fields}), encoding="utf-8")
    return model


@pytest.mark.parametrize("field, value, problem", [
    ("num_attention_heads", float("nan"), "must be a whole number"),
    ("num_attention_heads", "4", "must be a whole number"),
    ("num_attention_heads", 0, "at least 1"),
    ("num_attention_heads", -4, "at least 1"),
    ("num_key_value_heads", True, "must be a whole number"),
    ("hidden_size", [64], "must be a whole number"),
    ("num_key_value_heads", 3, "does not divide"),
    ("rms_norm_eps", float("inf"), "must be finite"),
    ("rms_norm_eps", "1e-6", "must be a number"),
    ("rope_parameters", {"rope_theta": float("nan"), "rope_type": "default"}, "must be finite"),
])
def test_config_field_of_the_wrong_type_or_range_is_an_input_error(tmp, field, value, problem):
    model = edited_model(tmp, **{field: value})
    refused(tmp, real_args(tmp, model), str(model / "config.json"), field, problem)


def test_engine_config_field_is_checked_as_config_json_is(tmp):
    (tmp / "engine.json").write_text(json.dumps({"num_attention_heads": -4}), encoding="utf-8")
    refused(tmp, [*real_args(tmp, MODEL), "--rollout-config", "engine.json"], "engine.json",
            "num_attention_heads", "at least 1")


@pytest.mark.parametrize("field, value, tensor", [
    ("num_attention_heads", 8, "q_proj"),          # 8 x 16 = 128 query rows; the checkpoint holds 64
    ("num_key_value_heads", 2, "k_proj"),          # 2 x 16 = 32 key rows; the checkpoint holds 16
    ("head_dim", 32, "q_proj"),                    # 4 x 32 = 128 query rows
])
def test_head_counts_that_do_not_fit_the_checkpoint_are_an_input_error(tmp, field, value, tensor):
    model = edited_model(tmp, **{field: value})
    err = refused(tmp, real_args(tmp, model), str(model / "config.json"), "does not fit the checkpoint",
                  f"model.layers.0.self_attn.{tensor}.weight")
    assert field in err


def test_engine_config_head_counts_are_checked_against_the_checkpoint(tmp):
    config = json.loads((MODEL / "config.json").read_text(encoding="utf-8"))
    (tmp / "engine.json").write_text(json.dumps({**config, "num_key_value_heads": 4}), encoding="utf-8")
    refused(tmp, [*real_args(tmp, MODEL), "--rollout-config", "engine.json"], "engine.json",
            "num_key_value_heads/head_dim does not fit the checkpoint", "k_proj.weight has 16 rows")


def test_head_counts_of_a_family_with_other_projections_are_not_held_to_heads_times_size():
    # DeepSeek's latent attention and Qwen3-Next's gated q give q_proj other row counts than
    # heads x head size: only the reference forward's families are checked.
    from dumpcompare import modelconfig
    from dumpcompare.errors import InputError
    shapes = {"model.layers.0.self_attn.q_proj.weight": (8 * 192, 2048)}
    config = {"model_type": "deepseek_v2", "num_attention_heads": 8, "hidden_size": 2048}
    assert modelconfig.check_heads(config, shapes, "config.json") is config
    with pytest.raises(InputError, match="q_proj"):
        modelconfig.check_heads({**config, "model_type": "llama"}, shapes, "config.json")


def test_config_number_too_long_to_read(tmp):
    model = edited_model(tmp)
    (model / "config.json").write_text('{"num_attention_heads": ' + "9" * 5000 + "}", encoding="utf-8")
    refused(tmp, real_args(tmp, model), str(model / "config.json"), "a number too long to read")


def findings(out: Path) -> tuple:
    """What a run found: the first divergence, the module statuses and what the reference forward did."""
    doc4 = json.loads((out / "output_4_module_analysis.json").read_text(encoding="utf-8"))
    modules = [(str(m.get("train_modules")), m.get("status"), m.get("category"), m.get("side"))
               for m in doc4["modules"]]
    ref = doc4["reference_forward"]
    return doc4["first_divergence"], modules, ref.get("ran"), ref.get("first_departure")


@pytest.mark.parametrize("pair", [REAL, TENSOR_PAIR], ids=["statistics", "tensor"])
def test_layer_count_far_above_the_tensors_uses_the_layers_present(tmp, pair):
    model = edited_model(tmp, num_hidden_layers=10 ** 9)
    runs = {}
    for name, folder in (("edited", model), ("unedited", MODEL)):
        args = ["--train", pair / "train", "--rollout", pair / "rollout", "--model", folder]
        rc, _, err = run(*args, "--out-dir", tmp / name, "--quiet", cwd=tmp)
        assert rc == 0 and "Traceback" not in err, err
        runs[name] = findings(tmp / name)
    assert runs["edited"] == runs["unedited"]
    assert runs["unedited"][2] is (pair == TENSOR_PAIR)      # the tensor pair runs the reference forward
