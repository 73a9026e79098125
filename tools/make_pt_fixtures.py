"""Write the real-torch .pt fixtures of tests/data/pt/ and their expected values.

Needs torch (a CPU build is enough); the tests that read these files do not. Every fixture is a
plain ``torch.save`` of a tiny tensor (or of what msprobe or a user could plausibly save), and
``expected.json`` records, per file, the stored dtype, the shape and the exact values as flat lists
(bfloat16 as its exact float32 widening, complex as [real, imag] pairs, NaN/Infinity as Python's
json writes them) so the tests can compare bit for bit without torch.

    python tools/make_pt_fixtures.py [--out tests/data/pt]
"""
import argparse
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

# Values that reach each dtype's extremes where the dtype allows it.
DTYPE_VALUES = {
    torch.float64: [-2.5, -1e-300, 0.0, 0.1, 1.5, 1e300],
    torch.float32: [-2.5, -1e-30, 0.0, 0.1, 1.5, 3.0e38],
    torch.float16: [-2.5, -0.0001, 0.0, 0.1, 1.5, 65504.0],
    torch.bfloat16: [-2.5, -1e-30, 0.0, 0.1, 1.5, 3.0e38],
    torch.complex128: [1 + 2j, -0.5j, 0, 3.25, -1e300 + 1j, 7 - 7j],
    torch.complex64: [1 + 2j, -0.5j, 0, 3.25, -1e30 + 1j, 7 - 7j],
    torch.int64: [-2**63, -1, 0, 1, 12345678901234, 2**63 - 1],
    torch.int32: [-2**31, -1, 0, 1, 123456789, 2**31 - 1],
    torch.int16: [-2**15, -1, 0, 1, 12345, 2**15 - 1],
    torch.int8: [-128, -1, 0, 1, 42, 127],
    torch.uint8: [0, 1, 2, 128, 200, 255],
    torch.bool: [True, False, False, True, True, False],
    torch.uint16: [0, 1, 2, 1000, 40000, 2**16 - 1],
    torch.uint32: [0, 1, 2, 1000, 3_000_000_000, 2**32 - 1],
    torch.uint64: [0, 1, 2, 1000, 2**63, 2**64 - 1],
}
SPECIALS = [float("nan"), float("inf"), float("-inf"), -0.0, 1e-45, -3.0e38]


def short_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def flat_values(tensor: torch.Tensor) -> list:
    flat = tensor.detach().reshape(-1)
    if flat.dtype == torch.bfloat16:
        flat = flat.float()  # exact: every bfloat16 is a float32
    if flat.is_complex():
        return [[z.real, z.imag] for z in flat.tolist()]
    return flat.tolist()


def one_line_per_file(expected: dict) -> str:
    """JSON with one line per fixture, so a regenerated file diffs readably."""
    def block(entries: dict) -> str:
        return ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in entries.items())
    return (f'{{"torch_version": {json.dumps(expected["torch_version"])},\n'
            f' "files": {{\n{block(expected["files"])}\n }},\n'
            f' "refused": {{\n{block(expected["refused"])}\n }}}}\n')


def fixtures() -> dict:
    """File name -> (object to torch.save, the tensor synth.ptfile.load_tensor must return from it)."""
    out = {}
    for dtype, values in DTYPE_VALUES.items():
        t = torch.tensor(values, dtype=dtype).reshape(2, 3)
        out[f"dtype_{short_name(dtype)}.pt"] = (t, t)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        t = torch.tensor(SPECIALS, dtype=dtype)
        out[f"special_{short_name(dtype)}.pt"] = (t, t)
    for dtype, value in ((torch.float32, 3.5), (torch.bfloat16, -0.3), (torch.int64, -7),
                         (torch.bool, True)):
        t = torch.tensor(value, dtype=dtype)
        out[f"scalar_{short_name(dtype)}.pt"] = (t, t)
    for name, empty in (("empty_float32.pt", torch.zeros(0, 3)),
                        ("empty_bfloat16.pt", torch.zeros(2, 0, 4, dtype=torch.bfloat16))):
        out[name] = (empty, empty)

    base = torch.arange(40, dtype=torch.float32).reshape(5, 8)
    # msprobe saves a contiguous clone; the others keep their view geometry in the file.
    transposed = base.t().contiguous()
    out["view_contiguous_clone.pt"] = (transposed, transposed)
    out["view_transposed.pt"] = (base.t(), base.t())
    window = base[1:4, 2:7:2]  # storage offset 10, strides (8, 2)
    out["view_offset.pt"] = (window, window)
    expanded = torch.tensor([1.5, -2.0], dtype=torch.float64).expand(3, 2)  # stride (0, 1)
    out["view_expand.pt"] = (expanded, expanded)

    param = torch.nn.Parameter(torch.tensor([[0.25, -0.5], [1.0, 2.0]]))
    out["parameter.pt"] = (param, param)
    first, second = torch.tensor([1, 2, 3], dtype=torch.int32), torch.ones(2)
    out["dict_of_tensors.pt"] = ({"first": first, "second": second}, first)
    out["list_of_tensors.pt"] = ([first, second], first)
    linear = torch.nn.Linear(2, 3)
    with torch.no_grad():
        linear.weight.copy_(torch.arange(6, dtype=torch.float32).reshape(3, 2) / 4)
        linear.bias.fill_(-1)
    state = linear.state_dict()  # an OrderedDict carrying _metadata, as users save it
    out["state_dict.pt"] = (state, state["weight"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "pt")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    expected = {"torch_version": torch.__version__, "files": {}, "refused": {}}
    for name, (obj, tensor) in fixtures().items():
        torch.save(obj, args.out / name)
        expected["files"][name] = {"dtype": short_name(tensor.dtype), "shape": list(tensor.shape),
                                   "values": flat_values(tensor)}
    # A dtype the reader does not support must be refused by name, not misread.
    torch.save(torch.zeros(2, dtype=torch.float8_e4m3fn), args.out / "unsupported_float8.pt")
    expected["refused"]["unsupported_float8.pt"] = "refused pickle global torch.float8_e4m3fn"

    (args.out / "expected.json").write_text(one_line_per_file(expected))
    total = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"wrote {len(expected['files']) + len(expected['refused'])} fixtures to {args.out} "
          f"({total} bytes)")


if __name__ == "__main__":
    main()
