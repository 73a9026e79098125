#!/usr/bin/env python3
"""Scan PyTorch and JAX training code for patterns that cause silent bugs.

Each finding gives file:line, the rule, the code that matched and what to check. By default only
patterns that are usually wrong are reported; --all adds the wider families worth a look (every
reshape, squeeze, freeze, unweighted loss). A line ending in `# ml-debug: ok <reason>` is skipped,
and the reason is the explanation a reviewer needs. Files and directories (searched for *.py) are
accepted. Exit 0 nothing found, 1 findings, 2 unreadable input.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

from mldebug_common import Finding, InputError, ReadSummary, count_lines, make_parser, read_text, report, run
from tensor_flow import (LOSSES, benign_detach, call_name, last, normalised_twice, parents_of,
                         reference_forward)

TOOL = "scan_silent_bugs"
SUPPRESS = re.compile(r"#\s*ml-debug:\s*ok\b", re.IGNORECASE)


@dataclass(frozen=True)
class Rule:
    """A silent-bug pattern: its id, whether it is shown by default, and what to check."""

    id: str
    default: bool
    check: str


RULES = {r.id: r for r in (
    Rule("SB-SOFTMAX-CE", True, "cross-entropy applies log-softmax itself (and NLL expects "
         "log-probabilities); pass logits, or the loss sits near ln(C) with tiny gradients"),
    Rule("SB-DETACH", True, "a detach cuts the gradient path; add a comment saying why this part "
         "must not learn from this loss"),
    Rule("SB-DATA-WRITE", True, "writing through .data bypasses autograd and the optimizer's view "
         "of the tensor; use torch.no_grad() and a normal in-place op"),
    Rule("SB-ITEM-IN-FORWARD", True, ".item()/.numpy()/.tolist() in forward leaves the graph; "
         "any loss built from it has no gradient"),
    Rule("SB-NO-GRAD-BACKWARD", True, "backward or an optimizer step under no_grad/inference_mode: "
         "nothing was recorded, so nothing learns"),
    Rule("SB-STEP-ORDER", True, "the order must be zero_grad, backward, (clip), step; read this loop"),
    Rule("SB-NO-ZERO-GRAD", True, "backward and step run in this loop but gradients are never "
         "zeroed in it, so they accumulate across iterations; if that is deliberate accumulation, "
         "zero them on the accumulation boundary"),
    Rule("SB-SCHED-PER-BATCH", True, "a per-epoch scheduler is stepped inside the batch loop, so "
         "it decays (number of batches) times too fast"),
    Rule("SB-EVAL-NO-TRAIN", True, "model.eval() is called inside the training loop but "
         "model.train() is not, so training continues with dropout off and frozen norm statistics"),
    Rule("SB-NO-EVAL", True, "evaluation under no_grad with no model.eval() anywhere: dropout stays "
         "on and batch-norm statistics keep updating during validation"),
    Rule("SB-SQUEEZE-ALL", True, "squeeze() without a dim also drops a batch axis of size 1, and "
         "later ops broadcast instead of failing; name the dim"),
    Rule("SB-SWALLOW", True, "an except that only passes or continues hides crashes and NaN "
         "batches; let it raise, or log and count what is skipped"),
    Rule("SB-NAN-MASK", True, "masking or skipping non-finite values hides the first bad step; "
         "find where the NaN starts instead"),
    Rule("SB-FIT-LEAK", True, "fit_transform on data not named as training data; statistics "
         "learned from evaluation rows (or all rows) reach the model"),
    Rule("SB-WORKER-RNG", True, "NumPy/stdlib random in __getitem__: DataLoader workers can start "
         "from the same state and repeat 'random' augmentations; seed per worker"),
    Rule("SB-JAX-KEY-REUSE", True, "the same PRNG key feeds two random calls (or one call in a "
         "loop) without a split, so the draws are identical"),
    Rule("SB-JAX-PRINT", True, "print inside jit executes only while tracing and shows abstract "
         "tracers; use jax.debug.print"),
    Rule("SB-JAX-NUMPY", True, "NumPy inside jit runs at trace time on concrete values or fails; "
         "use jax.numpy"),
    Rule("SB-SHUFFLE-SPLIT", True, "a shuffled random split of time-ordered rows puts the future in "
         "the training set; split by time"),
    Rule("SB-RESHAPE", False, "view/reshape reinterprets memory; if the axes are in another order "
         "this mixes batch and feature values with a valid shape. Test with prime-sized dims"),
    Rule("SB-BROADCAST", False, "check both operands have the same shape; (B,1) against (B,) "
         "broadcasts to (B,B) and the mean is silently wrong"),
    Rule("SB-EXPAND", False, "expand/repeat/unsqueeze can hide a size mismatch; print shapes"),
    Rule("SB-DATA-READ", False, ".data reads bypass autograd; prefer .detach() with a comment"),
    Rule("SB-FREEZE", False, "list which parameters end up frozen and confirm each is meant to be"),
    Rule("SB-CE-NO-WEIGHT", False, "an unweighted loss on skewed classes can learn the majority "
         "class; count the classes"),
    Rule("SB-LOSS-SIGN", False, "check the optimisation direction: a flipped sign trains the "
         "opposite behaviour with healthy-looking curves"),
    Rule("SB-INPLACE-FORWARD", False, "in-place edits in forward can overwrite values backward "
         "needs; check autograd's version counter does not fire or hide a copy"),
    Rule("SB-LOSS-ITEM", False, ".item()/.numpy() in a loss function: fine for logging, wrong if "
         "the value feeds the returned loss"),
    Rule("SB-JAX-ASTYPE", False, "casts inside JAX may clamp instead of wrap depending on backend"),
    Rule("SB-JAX-SETITEM", False, "JAX arrays are immutable; use x.at[i].set(v)"),
)}

LINE_PATTERNS = (
    ("SB-SQUEEZE-ALL", re.compile(r"\.squeeze\(\s*\)|torch\.squeeze\(\s*[\w.\[\]]+\s*\)")),
    ("SB-DATA-WRITE", re.compile(r"\b(?:p|param\w*|\w*weight\w*|\w*bias\w*|grad)\.data\s*"
                                 r"(?:\[[^\]]*\]\s*)?=[^=]|\.data\.\w+_\(")),
    ("SB-NAN-MASK", re.compile(r"nan_to_num\(")),
    ("SB-RESHAPE", re.compile(r"\.(?:view|reshape)\(")),
    ("SB-BROADCAST", re.compile(r"\b(?:mse_loss|l1_loss|smooth_l1_loss)\("
                                r"|\(\s*[\w.]+\s*-\s*[\w.]+\s*\)\s*\*\*\s*2")),
    ("SB-EXPAND", re.compile(r"\.(?:expand|repeat|unsqueeze)\(")),
    # `torch.utils.data` is a package, not a tensor's .data; import lines are skipped too.
    ("SB-DATA-READ", re.compile(r"^(?!\s*(?:from|import)\s)"
                                r"(?=.*(?<!utils)\.data\b(?!\s*(?:\[[^\]]*\]\s*)?=[^=])(?!\.\w+_\())")),
    ("SB-FREEZE", re.compile(r"requires_grad\s*=\s*False|requires_grad_\(\s*False|\.freeze\(")),
    ("SB-CE-NO-WEIGHT", re.compile(r"CrossEntropyLoss\(\s*\)")),
    ("SB-LOSS-SIGN", re.compile(r"maximize\s*=\s*True|\(\s*-\s*\w*loss\w*\s*\)\.backward"
                                r"|\b1\s*-\s*\w*(?:acc|score|metric)")),
    ("SB-JAX-ASTYPE", re.compile(r"\.astype\(")),
)
PER_EPOCH_SCHEDULERS = ("StepLR", "MultiStepLR", "ExponentialLR", "ReduceLROnPlateau")
TIME_HINTS = re.compile(r"\b(date|datetime|timestamp|time_idx|lag|rolling|shift\(|forecast)", re.IGNORECASE)
RANDOM_SAMPLERS_SKIP = {"split", "fold_in", "PRNGKey", "key", "key_data", "wrap_key_data", "clone"}


def receiver(node: ast.Call) -> str:
    """Name of the object a method is called on (`opt` in `opt.step()`), or ''."""
    if isinstance(node.func, ast.Attribute):
        return call_name(node.func.value) if not isinstance(node.func.value, ast.Call) else ""
    return ""


def calls_in(nodes, skip_functions: bool = True):
    """All Call nodes under `nodes` in source order, not entering nested function definitions."""
    stack = list(reversed(nodes if isinstance(nodes, list) else [nodes]))
    out = []
    while stack:
        node = stack.pop()
        if skip_functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            out.append(node)
        stack.extend(reversed(list(ast.iter_child_nodes(node))))
    return sorted(out, key=lambda c: (c.lineno, c.col_offset))


def is_opt_step(call: ast.Call) -> bool:
    """`optimizer.step()` (receiver names an optimizer, not a scheduler) or `scaler.step(opt)`."""
    if last(call_name(call)) != "step":
        return False
    recv = receiver(call).lower()
    return ("opt" in recv and "sched" not in recv) or ("scaler" in recv and bool(call.args))


def is_softmax(node: ast.AST) -> bool:
    """True when an expression contains a softmax call (log_softmax does not count)."""
    return any(isinstance(c, ast.Call) and last(call_name(c)).lower() == "softmax"
               for c in ast.walk(node))


def is_jitted(fn: ast.FunctionDef) -> bool:
    """True when a decorator mentions jit (`@jax.jit`, `@jit`, `@partial(jax.jit, ...)`)."""
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


class Scanner(ast.NodeVisitor):
    """Walks one module's AST and records findings for the structural rules."""

    def __init__(self, lines: list[str], comment_lines: set[int]):
        self.lines = lines
        self.comment_lines = comment_lines
        self.hits: list[tuple[int, str]] = []
        self.details: dict[tuple[int, str], str] = {}
        self.loss_names: dict[str, str] = {}  # instance name -> loss class, e.g. self.criterion
        self.per_epoch_scheds: set[str] = set()
        self.jax_random = {"jax.random"}
        self.forward_softmax = False  # a forward() returns probabilities
        self.functions: dict[str, ast.FunctionDef] = {}  # functions and methods of the file, by name
        self.training_loops: list[int] = []  # lines of the loops that run backward

    def hit(self, node: ast.AST | int, rule: str, detail: str = "") -> None:
        """Record a rule hit at a node's line (or a line number), with what was found there."""
        line = node if isinstance(node, int) else node.lineno
        self.hits.append((line, rule))
        if detail:
            self.details[(line, rule)] = detail

    def scan(self, tree: ast.Module) -> None:
        """Collect names bound to losses, schedulers and JAX aliases, then run every rule."""
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, node)
            if isinstance(node, ast.FunctionDef) and node.name == "forward":
                self.forward_softmax |= any(
                    isinstance(r, ast.Return) and r.value is not None and is_softmax(r.value)
                    for r in ast.walk(node))
            if isinstance(node, ast.ImportFrom) and node.module == "jax":
                self.jax_random.update(a.asname or a.name for a in node.names if a.name == "random")
            if isinstance(node, ast.Import):
                self.jax_random.update(a.asname for a in node.names if a.name == "jax.random" and a.asname)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                name = call_name(node.value)
                targets = [ast.unparse(t) for t in node.targets]
                if last(name) in LOSSES:
                    self.loss_names.update((t, last(name)) for t in targets)
                if last(name) in PER_EPOCH_SCHEDULERS or (
                        last(name) == "CosineAnnealingLR" and "epoch" in ast.unparse(node.value).lower()):
                    self.per_epoch_scheds.update(targets)
        self.visit(tree)
        self.data_flow(tree)
        self.detaches(tree)
        self.module_rules(tree)
        self.key_reuse([s for s in tree.body
                        if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))])

    def data_flow(self, tree: ast.Module) -> None:
        """Probabilities reaching a loss that normalises again, followed within each function."""
        bodies = [tree.body] + [n.body for n in ast.walk(tree)
                                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for body in bodies:
            for line, why in normalised_twice(body, self.loss_names):
                self.hit(line, "SB-SOFTMAX-CE", why)

    def detaches(self, tree: ast.Module) -> None:
        """Each .detach() that is neither explained by a comment nor a known-correct idiom."""
        parents = parents_of(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and last(call_name(node)) == "detach" and not node.args \
                    and not self.commented(node.lineno) and benign_detach(node, parents) is None:
                self.hit(node, "SB-DETACH")

    def commented(self, line: int) -> bool:
        """True when the line, or the nearest non-blank line above it, is or carries a comment."""
        if line in self.comment_lines:
            return True
        prev = next((j for j in range(line - 1, 0, -1) if self.lines[j - 1].strip()), 0)
        return bool(prev) and self.lines[prev - 1].strip().startswith("#")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        """Rules scoped to a function: forward, loss functions, __getitem__, jitted JAX code."""
        calls = calls_in(node.body)
        name = node.name.lower()
        for call in calls:
            method = last(call_name(call))
            if method in ("item", "numpy", "tolist") and not call.args:
                if name == "forward":
                    self.hit(call, "SB-ITEM-IN-FORWARD")
                elif "loss" in name:
                    self.hit(call, "SB-LOSS-ITEM")
            if name == "__getitem__" and re.match(r"(np|numpy)\.random\.|random\.", call_name(call)) \
                    and "torch" not in call_name(call):
                self.hit(call, "SB-WORKER-RNG")
            if is_jitted(node):
                if call_name(call) == "print":
                    self.hit(call, "SB-JAX-PRINT")
                elif call_name(call).startswith(("np.", "numpy.")):
                    self.hit(call, "SB-JAX-NUMPY")
        if name == "forward":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and re.fullmatch(
                        r"(add|sub|mul|div|clamp|masked_fill|copy|relu|sigmoid|tanh|exp|fill|"
                        r"index_add|scatter)_", last(call_name(sub))):
                    self.hit(sub, "SB-INPLACE-FORWARD")
        if is_jitted(node):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Assign, ast.AugAssign)):
                    targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                    if any(isinstance(t, ast.Subscript) for t in targets):
                        self.hit(sub, "SB-JAX-SETITEM")
        self.key_reuse(node.body)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        """A loss in a file whose forward returns softmax, and fit_transform on non-training data."""
        name = call_name(node)
        loss = self.loss_names.get(name) or last(name)
        if loss in ("cross_entropy", "nll_loss", "CrossEntropyLoss", "NLLLoss") and node.args \
                and self.forward_softmax:
            self.hit(node, "SB-SOFTMAX-CE", "a forward() in this file returns softmax output")
        if last(name) == "fit_transform" and node.args:
            arg = ast.unparse(node.args[0]).lower()
            if "train" not in arg:
                self.hit(node, "SB-FIT-LEAK")
        self.generic_visit(node)

    def visit_With(self, node: ast.With) -> None:
        """Backward or an optimizer step inside no_grad/inference_mode."""
        ctx = " ".join(ast.unparse(i.context_expr) for i in node.items)
        if "no_grad" in ctx or "inference_mode" in ctx:
            for call in calls_in(node.body):
                if last(call_name(call)) == "backward" or is_opt_step(call):
                    self.hit(call, "SB-NO-GRAD-BACKWARD")
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        """An except clause that catches everything and only passes or continues."""
        for handler in node.handlers:
            broad = handler.type is None or ast.unparse(handler.type) in ("Exception", "BaseException")
            if broad and all(isinstance(s, (ast.Pass, ast.Continue)) for s in handler.body):
                self.hit(handler, "SB-SWALLOW")
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        """`if isnan(loss): continue` style skipping of non-finite batches."""
        test = ast.unparse(node.test)
        if re.search(r"isnan|isinf|isfinite", test) and any(
                isinstance(s, ast.Continue) for s in node.body):
            self.hit(node, "SB-NAN-MASK")
        self.generic_visit(node)

    def visit_For(self, node: ast.AST) -> None:
        """Training-loop rules, applied to the innermost loop that holds backward and step."""
        body_calls = calls_in(node.body)
        has_backward = any(last(call_name(c)) == "backward" for c in body_calls)
        inner_loops = [n for n in ast.walk(node) if n is not node and isinstance(n, (ast.For, ast.While))]
        inner_train = any(
            any(last(call_name(c)) == "backward" for c in calls_in(loop.body))
            and any(is_opt_step(c) for c in calls_in(loop.body)) for loop in inner_loops)
        if has_backward and not inner_train and any(is_opt_step(c) for c in body_calls):
            self.loop_order(node, body_calls)
        if has_backward:
            self.training_loops.append(node.lineno)
            self.loop_modes(node, body_calls)
            for loop in inner_loops:
                for call in calls_in(loop.body):
                    if last(call_name(call)) == "step" and receiver(call) in self.per_epoch_scheds \
                            and any(last(call_name(c)) == "backward" for c in calls_in(loop.body)):
                        self.hit(call, "SB-SCHED-PER-BATCH")
        self.generic_visit(node)

    visit_While = visit_For

    def loop_order(self, loop: ast.AST, calls: list[ast.Call]) -> None:
        """zero_grad before backward before step, and gradients zeroed somewhere in the loop."""
        kinds = []
        for c in calls:
            method = last(call_name(c))
            if method == "zero_grad":
                kinds.append(("zero", c))
            elif method == "backward":
                kinds.append(("backward", c))
            elif is_opt_step(c):
                kinds.append(("step", c))
        order = [k for k, _ in kinds]
        first_backward = order.index("backward")
        first_step = order.index("step")
        if first_step < first_backward:
            self.hit(kinds[first_step][1], "SB-STEP-ORDER")
        elif "zero" in order[first_backward:first_step]:
            self.hit(kinds[first_backward + order[first_backward:].index("zero")][1], "SB-STEP-ORDER")
        if "zero" not in order:
            self.hit(loop, "SB-NO-ZERO-GRAD")

    def loop_modes(self, loop: ast.AST, calls: list[ast.Call]) -> None:
        """A training loop that switches to eval() must switch back with train().

        The switch often sits in a helper the loop calls (`evaluate(model)`), so the calls of the
        file's own functions that the loop calls are read too, two calls deep.
        """
        trains = [c for c in calls if last(call_name(c)) == "train"]
        evals = [c for c in calls if last(call_name(c)) == "eval" and not c.args]
        if evals and not trains:
            self.hit(evals[0], "SB-EVAL-NO-TRAIN")
            return
        for call in calls:
            inner = self.helper_calls(call, depth=2)
            if trains or any(last(call_name(c)) == "train" for c in inner):
                continue
            switch = next((c for c in inner if last(call_name(c)) == "eval" and not c.args), None)
            if switch is not None:
                self.hit(call, "SB-EVAL-NO-TRAIN", f"{last(call_name(call))}() switches to eval() on line "
                         f"{switch.lineno} and the loop never calls train()")
                return

    def helper_calls(self, call: ast.Call, depth: int) -> list[ast.Call]:
        """The calls made by the file's own function that `call` runs, following helpers `depth` deep."""
        # Only a plain call or a call on self names the file's own function; `opt.step()` is not `def step`.
        own = isinstance(call.func, ast.Name) or receiver(call) in ("self", "cls")
        fn = self.functions.get(last(call_name(call))) if own else None
        if fn is None or depth == 0:
            return []
        inner = calls_in(fn.body)
        return inner + [c for sub in inner for c in self.helper_calls(sub, depth - 1)]

    def module_rules(self, tree: ast.Module) -> None:
        """Whole-file rules: validation without eval(), shuffled splits of time-ordered data."""
        calls = calls_in(tree.body, skip_functions=False)
        names = [last(call_name(c)) for c in calls]
        if "backward" in names and "eval" not in names:
            for node in ast.walk(tree):
                if isinstance(node, ast.With) and any("no_grad" in ast.unparse(i.context_expr)
                                                      for i in node.items) and not reference_forward(node):
                    self.hit(node, "SB-NO-EVAL")
                    break
        source = "\n".join(self.lines)
        for c in calls:
            if last(call_name(c)) == "train_test_split" and TIME_HINTS.search(source):
                shuffle = [k for k in c.keywords if k.arg == "shuffle"]
                if not shuffle or ast.unparse(shuffle[0].value) != "False":
                    self.hit(c, "SB-SHUFFLE-SPLIT")

    def key_reuse(self, body: list[ast.stmt]) -> None:
        """JAX: a key passed to two samplers with no reassignment between, or reused in a loop."""
        events = []
        for node in ast.walk(ast.Module(body=body, type_ignores=[])):
            if isinstance(node, ast.Call):
                name = call_name(node)
                if name.rpartition(".")[0] in self.jax_random and last(name) not in RANDOM_SAMPLERS_SKIP \
                        and node.args and isinstance(node.args[0], ast.Name):
                    events.append((node.lineno, node.col_offset, "use", node.args[0].id, node))
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.For)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            events.append((node.lineno, -1, "bind", n.id, node))
        last_use: dict[str, int] = {}
        for _, _, kind, name, node in sorted(events, key=lambda e: (e[0], e[1])):
            if kind == "bind":
                last_use.pop(name, None)
            elif name in last_use:
                self.hit(node, "SB-JAX-KEY-REUSE")
            else:
                last_use[name] = node.lineno
        for loop in ast.walk(ast.Module(body=body, type_ignores=[])):
            if isinstance(loop, (ast.For, ast.While)):
                bound = {n.id for s in ast.walk(loop) if isinstance(s, (ast.Assign, ast.AugAssign, ast.For))
                         for t in (s.targets if isinstance(s, ast.Assign) else [s.target])
                         for n in ast.walk(t) if isinstance(n, ast.Name)}
                for _, _, kind, name, node in events:
                    if kind == "use" and name not in bound and loop.lineno < node.lineno <= loop.end_lineno:
                        self.hit(node, "SB-JAX-KEY-REUSE")


def comment_lines_of(source: str) -> set[int]:
    """Line numbers that carry a comment token, so '# why' next to a detach is recognised."""
    out = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                out.add(tok.start[0])
    except (tokenize.TokenError, SyntaxError):
        out = {i for i, ln in enumerate(source.splitlines(), 1) if "#" in ln}
    return out


def code_part(line: str) -> str:
    """The line without its trailing comment (a `#` inside quotes is kept)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


def scan_file(path: str, show_all: bool) -> tuple[list[Finding], ReadSummary]:
    """The findings for one Python file, deduplicated and in line order, and what was read.

    What was read: the training loops found, and the lines passed over as marked ok.
    """
    source = read_text(path)
    lines = source.splitlines()
    comments = comment_lines_of(source)
    hits: list[tuple[int, str]] = []
    findings: list[Finding] = []
    for i, line in enumerate(lines, 1):
        code = code_part(line)
        for rule, rx in LINE_PATTERNS:
            if rx.search(code):
                hits.append((i, rule))
    scanner = Scanner(lines, comments)
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        findings.append(Finding(path, exc.lineno or 1, "SB-SYNTAX",
                                f"file does not parse ({exc.msg}); only line patterns were checked"))
        # Without a tree the idioms cannot be told apart, so every uncommented detach is shown.
        hits += [(i, "SB-DETACH") for i, line in enumerate(lines, 1)
                 if ".detach()" in code_part(line) and not scanner.commented(i)]
    else:
        scanner.scan(tree)
        hits += scanner.hits
    ignored: dict[str, str] = {}
    for line_no, rule_id in sorted(set(hits)):
        rule = RULES[rule_id]
        text = lines[line_no - 1] if 0 < line_no <= len(lines) else ""
        if SUPPRESS.search(text) and (rule.default or show_all):
            ignored[f"line {line_no}"] = "marked '# ml-debug: ok'"
        if (not rule.default and not show_all) or SUPPRESS.search(text):
            continue
        detail = scanner.details.get((line_no, rule_id))
        findings.append(Finding(path, line_no, rule_id, f"`{text.strip()[:100]}`: "
                                + (f"{detail}; " if detail else "") + rule.check))
    loops = [str(n) for n in sorted(set(scanner.training_loops))]
    read = ReadSummary(path, "python", count_lines(source), loops, ignored, "training loops (lines)")
    return sorted(findings, key=lambda f: (f.line, f.rule)), read


def expand(paths: list[str]) -> list[str]:
    """Files as given, directories searched recursively for *.py, in a stable order."""
    out = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            out += sorted(str(f) for f in path.rglob("*.py"))
        elif path.exists():
            if path.suffix.lower() not in (".py", ".pyw"):
                raise InputError(f"{p}: not a Python file (expected .py source, got "
                                 f"'{path.suffix or 'no suffix'}')")
            if not read_text(p).strip():
                raise InputError(f"{p}: empty file, nothing to scan")
            out.append(p)
        else:
            raise InputError(f"{p}: no such file or directory")
    if not out:
        raise InputError(f"{', '.join(paths)}: no Python files found")
    return out


def main() -> int:
    """Parse arguments, scan each file, print the report and return the exit code."""
    parser = make_parser("scan_silent_bugs.py", __doc__,
                         "Rules: " + ", ".join(RULES) + ". Exit 0 nothing found, 1 findings, "
                         "2 unreadable input.")
    parser.add_argument("files", nargs="+", metavar="PATH", help="Python file or directory")
    parser.add_argument("--all", action="store_true", help="also report the wider look-here families")
    args = parser.parse_args()
    files = expand(args.files)
    findings: list[Finding] = []
    reads = []
    for path in files:
        found, read = scan_file(path, args.all)
        findings += found
        reads.append(read)
    return report(TOOL, files, findings, args.json, reads=reads)


if __name__ == "__main__":
    run(TOOL, main)
