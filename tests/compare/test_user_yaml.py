"""Issue 14: a malformed --naming or --tolerances file is an input error (exit 2) naming the file and the key."""
import pytest

from compare.test_compare_inputs import LLAMA, LLAMA_BAD, assert_usage_error, cli_in_process  # noqa: F401

# (option, file text, key the message must name, words it must hold)
BAD_FILES = [
    ("--naming", "layer_regex: '(layers'\n", "layer_regex", "not a valid regular expression"),
    ("--naming", "layer_regex: 'layers\\.'\n", "layer_regex", "capturing group"),
    ("--naming", "roles:\n  - {role: down, block: mlp, local: ['mlp\\.(dense']}\n", "roles[0].local[0]",
     "not a valid regular expression"),
    ("--naming", "ports:\n  myengine:\n    attn: [{map: {output.0: x}, when: {class: '[A-'}}]\n",
     "ports.myengine.attn[0].when.class", "not a valid regular expression"),
    ("--naming", "tensor_parallel:\n  overrides: [{module: '*down', rule: sum}]\n",
     "tensor_parallel.overrides[0].module", "not a valid regular expression"),
    ("--naming", "roles: {role: down}\n", "roles", "expected a list, found a mapping"),
    ("--naming", "roles:\n  - {local: ['mlp\\.x']}\n", "roles[0]", "missing block, role"),
    ("--naming", "wrappers:\n  segments: 3\n", "wrappers.segments", "expected a list, found a number"),
    ("--tolerances", "statistics:\n  float32: 1e-4\n", "statistics.float32", "write 1.0e-4"),
    ("--tolerances", "statistics:\n  float32: tight\n", "statistics.float32", "expected a finite number"),
    ("--tolerances", "statistics: [1, 2]\n", "statistics", "expected a mapping, found a list"),
    ("--tolerances", "tensor:\n  rel_l2: {float8: loose}\n", "tensor.rel_l2.float8", "expected a finite number"),
    ("--tolerances", "tensor:\n  elementwise:\n    float32: {rtol: .nan}\n", "tensor.elementwise.float32.rtol",
     "finite number"),
    ("--tolerances", "tensor:\n  elementwise:\n    fp8: {rtol: 0.1}\n", "tensor.elementwise.fp8", "missing atol"),
]


@pytest.mark.parametrize("option,text,key,words", BAD_FILES, ids=[f"{b[0][2:]}-{b[2]}" for b in BAD_FILES])
def test_malformed_user_yaml_exits_2_naming_file_and_key(tmp_path, cli_in_process, option, text, key, words):
    bad = tmp_path / "user.yaml"
    bad.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    proc = cli_in_process("--train", LLAMA, "--rollout", LLAMA_BAD, "--out-dir", out, option, bad)
    assert_usage_error(proc, out, str(bad), f"key '{key}'", words)


@pytest.mark.parametrize("option,text", [
    ("--naming", "layer_regex: '(?:^|\\.)(?:layers|blocks)\\.(\\d+)(?:\\.|$)'\n"
                 "ports:\n  myengine:\n    inherit: vllm\n    attn: [{map: {output.0: '{L}.attn_out'}}]\n"),
    ("--tolerances", "statistics:\n  float32: 1.0\n  float8: 0.5\ntensor:\n  elementwise:\n"
                     "    float8: {rtol: 0.1, atol: 0.01}\n"),
])
def test_wellformed_user_yaml_is_accepted(tmp_path, cli_in_process, option, text):
    good = tmp_path / "user.yaml"
    good.write_text(text, encoding="utf-8")
    proc = cli_in_process("--train", LLAMA, "--rollout", LLAMA_BAD, "--out-dir", tmp_path / "out", option, good,
                          "--quiet")
    assert proc.returncode == 0, proc.stderr
