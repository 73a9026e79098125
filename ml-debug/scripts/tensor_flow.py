#!/usr/bin/env python3
"""A little data flow for scan_silent_bugs.py: what a tensor is, followed through one function.

Follows names through assignments, reshapes (view, reshape, flatten, transpose ...), casts
(.float(), .to()), indexing and method calls such as `x.softmax(-1)`, so that probabilities reaching
a loss that normalises its input again are found however they were reshaped. Also recognises the
`.detach()` idioms that are right (old log-probabilities of a policy ratio, `x - x.detach()`, a
ratio's denominator, a call given both a tensor and its detached copy, a GAN's detached fake
batch, targets and advantages, values sent to a logger)
and `torch.no_grad()` blocks that run a reference model rather than an evaluation. The reasons are
in references/static_analysis.md. Run directly to print what each assignment in a file carries.
"""
from __future__ import annotations

import ast
import json
import re

from mldebug_common import SCHEMA_VERSION, InputError, make_parser, read_text, run

MODULES = {"torch", "F", "nn", "functional", "np", "numpy", "jnp", "jax"}
# Method or torch function name -> what its output is.
PRODUCERS = {"softmax": "probabilities", "sigmoid": "sigmoid output", "log_softmax": "log-probabilities"}
# Calls whose output is the same kind of tensor as their input (first argument or receiver).
PRESERVING = {"view", "reshape", "flatten", "float", "double", "half", "bfloat16", "to", "contiguous",
              "transpose", "permute", "squeeze", "unsqueeze", "clone", "type", "cuda", "cpu",
              "narrow", "select", "index_select", "masked_select", "gather", "view_as", "reshape_as",
              "movedim", "swapaxes", "expand", "expand_as", "chunk", "split", "unbind", "detach"}
# Loss -> the kinds of input it must not receive, because it normalises its input itself.
LOSSES = {
    "cross_entropy": ("probabilities", "sigmoid output"),
    "CrossEntropyLoss": ("probabilities", "sigmoid output"),
    "nll_loss": ("probabilities", "sigmoid output"),
    "NLLLoss": ("probabilities", "sigmoid output"),
    "binary_cross_entropy_with_logits": ("probabilities", "sigmoid output"),
    "BCEWithLogitsLoss": ("probabilities", "sigmoid output"),
}
# Name parts of tensors meant to carry no gradient into this loss (matched as whole parts of
# snake_case or camelCase names, so `threshold` or `prefix` do not count as `old` or `ref`).
NO_GRAD_PARTS = {"old", "ref", "reference", "target", "targets", "baseline", "behav", "behavior",
                 "behaviour", "prev", "previous", "teacher", "stale", "frozen", "fixed", "fake",
                 "gen", "generated", "advantage", "advantages", "adv", "return", "returns",
                 "reward", "rewards", "label", "labels", "ema", "anchor"}
# Name parts of a model whose forward under no_grad is a fixed reference, not an evaluation.
REFERENCE_PARTS = {"ref", "reference", "teacher", "target", "old", "frozen", "ema"}
LOGGING = {"item", "cpu", "numpy", "tolist", "append", "log", "log_dict", "print", "add_scalar",
           "update", "write", "info", "debug"}


def call_name(node: ast.AST) -> str:
    """Dotted name of a call's function or an attribute chain, or '' if not a plain name."""
    func = node.func if isinstance(node, ast.Call) else node
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    elif isinstance(func, ast.Call):
        parts.append(call_name(func))
    return ".".join(reversed(parts))


def last(name: str) -> str:
    """Final component of a dotted name."""
    return name.rsplit(".", 1)[-1]


def name_parts(text: str) -> set[str]:
    """Lower-case word parts of identifiers: `old_logps refModel` -> old, logps, ref, model."""
    return {w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", text)}


def kind_of(node: ast.AST, env: dict[str, tuple[str, int]]) -> tuple[str, int] | None:
    """What an expression carries ((kind, line where it was made)), or None when unknown."""
    if isinstance(node, ast.Name):
        return env.get(node.id)
    if isinstance(node, ast.Attribute) and node.attr in ("T", "mT", "data"):
        return kind_of(node.value, env)
    if isinstance(node, ast.Subscript):
        return kind_of(node.value, env)
    if not isinstance(node, ast.Call):
        return env.get(ast.unparse(node)) if isinstance(node, ast.Attribute) else None
    name = last(call_name(node))
    if name.lower() in PRODUCERS:
        return PRODUCERS[name.lower()], node.lineno
    # `torch.flatten(x)` reads its first argument; `x.flatten()` and `F.softmax(x).float()` their receiver.
    is_method = isinstance(node.func, ast.Attribute) and not (
        isinstance(node.func.value, (ast.Name, ast.Attribute))
        and call_name(node.func.value).split(".")[0] in MODULES)
    source = node.func.value if is_method else (node.args[0] if node.args else None)
    if source is None:
        return None
    inner = kind_of(source, env)
    if name == "log" and inner and inner[0] == "probabilities":
        return "log-probabilities", inner[1]
    return inner if name in PRESERVING else None


def ordered(body: list[ast.stmt], kinds: tuple[type, ...]) -> list[ast.AST]:
    """Nodes of the given types under `body` in source order, not entering nested definitions."""
    out, stack = [], list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, kinds):
            out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return sorted(out, key=lambda n: (n.lineno, n.col_offset))


def normalised_twice(body: list[ast.stmt], loss_names: dict[str, str]) -> list[tuple[int, str]]:
    """(line, explanation) for each loss call whose input is already normalised.

    `loss_names` maps instance names (`self.criterion`) to the loss class they hold.
    """
    env: dict[str, tuple[str, int]] = {}
    out = []
    for node in ordered(body, (ast.Assign, ast.Call)):
        if isinstance(node, ast.Assign):
            kind = kind_of(node.value, env)
            for target in node.targets:
                key = ast.unparse(target)
                if kind:
                    env[key] = kind
                else:
                    env.pop(key, None)
            continue
        name = call_name(node)
        loss = loss_names.get(name) or (last(name) if last(name) in LOSSES else None)
        if loss and node.args:
            kind = kind_of(node.args[0], env)
            if kind and kind[0] in LOSSES[loss]:
                out.append((node.lineno, f"its input is {kind[0]} (made on line {kind[1]}) and "
                                         f"{loss} normalises again"))
    return out


def parents_of(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    """Map each node to its parent."""
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def benign_detach(call: ast.Call, parents: dict[ast.AST, ast.AST]) -> str | None:
    """Why a `.detach()` call is a known-correct idiom, or None when it needs a look."""
    receiver = ast.unparse(call.func.value) if isinstance(call.func, ast.Attribute) else ""
    node, parent = call, parents.get(call)
    # Climb through further casts and moves (`.detach().float()`), which change nothing here.
    while isinstance(parent, ast.Attribute) and isinstance(parents.get(parent), ast.Call):
        method = parent.attr
        if method in LOGGING:
            return "value sent to a logger"
        if method not in PRESERVING:
            break
        node, parent = parents[parent], parents.get(parents[parent])
    # `old = x.detach() if cached is None else cached`: the branch is what gets stored.
    while isinstance(parent, ast.IfExp) and node is not parent.test:
        node, parent = parent, parents.get(parent)
    if name_parts(receiver) & NO_GRAD_PARTS:
        return "the tensor is a target, a reference or an old policy's output by name"
    for ancestor in ancestors(node, parents):
        if isinstance(ancestor, ast.With) and any("no_grad" in ast.unparse(i.context_expr)
                                                  or "inference_mode" in ast.unparse(i.context_expr)
                                                  for i in ancestor.items):
            return "inside no_grad, where nothing is recorded anyway"
    if isinstance(parent, ast.Assign) and any(name_parts(ast.unparse(t)) & NO_GRAD_PARTS
                                              for t in parent.targets):
        return "stored as the old/reference copy"
    if isinstance(parent, ast.BinOp) and parent.right is node and isinstance(parent.op, (ast.Sub, ast.Div)) \
            and receiver and receiver in ast.unparse(parent.left):
        # The detached copy is the subtrahend or denominator of the same tensor.
        return "x - x.detach() or x / x.detach(): value one, gradient kept through the other side"
    if isinstance(parent, ast.Call) and node in parent.args and last(call_name(parent)) in LOGGING:
        return "value sent to a logger"
    if isinstance(parent, ast.keyword) and parent.arg and name_parts(parent.arg) & NO_GRAD_PARTS:
        return "passed as the old/reference argument by name"
    call = parents.get(parent) if isinstance(parent, ast.keyword) else parent
    if isinstance(call, ast.Call) and receiver:
        others = [a for a in call.args if a is not node] + [k.value for k in call.keywords if k.value is not node]
        if any(ast.unparse(a) == receiver for a in others):
            # loss(logp, logp.detach(), adv): the on-policy ratio exp(logp - logp.detach()) is one in value
            # and has the gradient of logp, the PPO/GRPO loss with a single update per batch.
            return "the call gets the tensor and its detached copy: an on-policy ratio"
    return None


def ancestors(node: ast.AST, parents: dict[ast.AST, ast.AST]):
    """Parents of a node, nearest first."""
    while node in parents:
        node = parents[node]
        yield node


def reference_forward(block: ast.With) -> bool:
    """True when a no_grad block runs a reference, teacher, target or old model, not an evaluation."""
    calls = ordered(block.body, (ast.Call,))
    return any(name_parts(ast.unparse(c)) & REFERENCE_PARTS for c in calls)


def main() -> int:
    """Print, for each file, each loss call whose input is already normalised, and why."""
    parser = make_parser("tensor_flow.py", __doc__, "Exit 0 read, 2 unreadable input.")
    parser.add_argument("files", nargs="+", metavar="FILE.py", help="Python file")
    args = parser.parse_args()
    for path in args.files:
        try:
            tree = ast.parse(read_text(path))
        except SyntaxError as exc:
            raise InputError(f"{path}:{exc.lineno}: not Python ({exc.msg})") from None
        found = normalised_twice(tree.body, {})
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += normalised_twice(fn.body, {})
        if args.json:
            print(json.dumps({"schema_version": SCHEMA_VERSION, "file": path,
                              "double_normalisation": [{"line": n, "why": w} for n, w in found]}))
        else:
            print("\n".join(f"{path}:{n}: {w}" for n, w in found) or f"{path}: no double normalisation")
    return 0


if __name__ == "__main__":
    run("tensor_flow", main)
