"""scan_silent_bugs: every default rule fires on its pattern and stays quiet on the clean version."""
import textwrap

import pytest

from scan_silent_bugs import RULES, scan_file

CLEAN = '''
import torch
import torch.nn.functional as F


class Net(torch.nn.Module):
    def forward(self, x):
        return self.head(self.body(x))


def train(model, loader, val_loader, opt, sched, epochs):
    for epoch in range(epochs):
        model.train()
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
        sched.step()
        model.eval()
        with torch.no_grad():
            for xb, yb in val_loader:
                logits = model(xb)
    return model
'''


def scan(tmp_path, source, show_all=False):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(source))
    return scan_file(str(path), show_all)[0]


def rules(tmp_path, source, show_all=False):
    return [f.rule for f in scan(tmp_path, source, show_all)]


def test_clean_training_loop_has_no_findings(tmp_path):
    assert rules(tmp_path, CLEAN) == []


@pytest.mark.parametrize("old, new, rule", [
    ("return self.head(self.body(x))", "return F.softmax(self.head(self.body(x)), dim=-1)", "SB-SOFTMAX-CE"),
    ("loss = F.cross_entropy(model(xb), yb)",
     "probs = F.softmax(model(xb), -1)\n            loss = F.cross_entropy(probs, yb)", "SB-SOFTMAX-CE"),
    ("loss = F.cross_entropy(model(xb), yb)",
     "loss = F.cross_entropy(model(xb), yb) + 0 * model(xb).detach().sum()", "SB-DETACH"),
    ("return self.head(self.body(x))", "self.scale = x.abs().max().item()\n        return self.head(x)",
     "SB-ITEM-IN-FORWARD"),
    ("            opt.zero_grad()\n", "", "SB-NO-ZERO-GRAD"),
    ("            loss.backward()\n            opt.step()", "            opt.step()\n            loss.backward()",
     "SB-STEP-ORDER"),
    ("            loss.backward()\n            opt.step()",
     "            loss.backward()\n            opt.zero_grad()\n            opt.step()", "SB-STEP-ORDER"),
    ("        model.train()\n", "", "SB-EVAL-NO-TRAIN"),
    ("        model.eval()\n", "", "SB-NO-EVAL"),
    ("logits = model(xb)", "logits = model(xb).squeeze()", "SB-SQUEEZE-ALL"),
    ("logits = model(xb)", "try:\n                    logits = model(xb)\n                except Exception:\n"
                           "                    pass", "SB-SWALLOW"),
    ("            loss.backward()", "            if torch.isnan(loss):\n                continue\n"
                                    "            loss.backward()", "SB-NAN-MASK"),
    ("logits = model(xb)", "logits = torch.nan_to_num(model(xb))", "SB-NAN-MASK"),
    ("        model.eval()\n        with torch.no_grad():",
     "        model.eval()\n        with torch.no_grad():\n            loss.backward()", "SB-NO-GRAD-BACKWARD"),
    ("    for epoch in range(epochs):", "    for p in model.parameters():\n        p.data = p.data * 0.5\n"
                                      "    for epoch in range(epochs):", "SB-DATA-WRITE"),
])
def test_each_default_rule_breaks_alone(tmp_path, old, new, rule):
    assert old in CLEAN
    found = rules(tmp_path, CLEAN.replace(old, new))
    assert found == [rule], found


def test_per_epoch_scheduler_stepped_per_batch(tmp_path):
    source = CLEAN.replace("            opt.step()\n        sched.step()", "            opt.step()\n            sched.step()")
    source = source.replace("def train(model, loader, val_loader, opt, sched, epochs):",
                            "def train(model, loader, val_loader, opt, epochs):\n"
                            "    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5)")
    assert rules(tmp_path, source) == ["SB-SCHED-PER-BATCH"]


def test_fit_transform_on_non_training_data(tmp_path):
    assert rules(tmp_path, "x_all = scaler.fit_transform(x_all)\n") == ["SB-FIT-LEAK"]
    assert rules(tmp_path, "x_train = scaler.fit_transform(x_train)\n") == []


def test_worker_rng_in_getitem(tmp_path):
    source = '''
    import numpy as np
    class D:
        def __getitem__(self, i):
            return self.x[i] + np.random.normal(0, 0.1)
    '''
    assert rules(tmp_path, source) == ["SB-WORKER-RNG"]


def test_shuffled_split_of_time_series(tmp_path):
    source = "df = load(); df['lag1'] = df.y.shift(1)\ntr, te = train_test_split(df, test_size=0.2)\n"
    assert rules(tmp_path, source) == ["SB-SHUFFLE-SPLIT"]
    assert rules(tmp_path, source.replace("test_size=0.2", "test_size=0.2, shuffle=False")) == []


JAX = '''
import jax
import jax.numpy as jnp
import numpy as np
from jax import random


@jax.jit
def step(params, x):
    return jnp.tanh(x @ params)


def init(key):
    w = random.normal(key, (3, 3))
    b = random.normal(key, (3,))
    return w, b


def noisy(key, n):
    out = []
    for _ in range(n):
        out.append(random.uniform(key, (2,)))
    return out
'''


def test_jax_key_reuse_sequential_and_in_loop(tmp_path):
    found = scan(tmp_path, JAX)
    assert [f.rule for f in found] == ["SB-JAX-KEY-REUSE", "SB-JAX-KEY-REUSE"]
    assert [f.line for f in found] == [15, 22]


def test_jax_split_key_is_clean(tmp_path):
    source = '''
    from jax import random
    def init(key):
        k1, k2 = random.split(key)
        return random.normal(k1, (3,)), random.normal(k2, (3,))
    '''
    assert rules(tmp_path, source) == []


def test_jax_print_and_numpy_inside_jit(tmp_path):
    source = JAX.replace("    return jnp.tanh(x @ params)",
                         "    print(x)\n    return jnp.tanh(np.dot(x, params))")
    assert sorted(set(rules(tmp_path, source))) == ["SB-JAX-KEY-REUSE", "SB-JAX-NUMPY", "SB-JAX-PRINT"]


def test_look_here_families_only_with_all(tmp_path):
    source = CLEAN.replace("logits = model(xb)", "logits = model(xb).view(8, -1)")
    assert rules(tmp_path, source) == []
    assert rules(tmp_path, source, show_all=True) == ["SB-RESHAPE"]


def test_suppression_comment_and_commented_detach(tmp_path):
    source = CLEAN.replace("logits = model(xb)", "logits = model(xb).squeeze()  # ml-debug: ok batch is never 1")
    assert rules(tmp_path, source) == []
    source = CLEAN.replace("logits = model(xb)", "logits = model(xb).detach()  # target network, no gradient")
    assert rules(tmp_path, source) == []


def test_unparseable_file_still_gets_line_rules(tmp_path):
    found = rules(tmp_path, "def broken(:\n    y = x.squeeze()\n")
    assert found == ["SB-SYNTAX", "SB-SQUEEZE-ALL"]


def test_example_script_findings(skill):
    found = {f.rule for f in scan_file(str(skill.examples / "train_buggy.py"), False)[0]}
    assert found == {"SB-WORKER-RNG", "SB-FIT-LEAK", "SB-NO-ZERO-GRAD", "SB-SOFTMAX-CE", "SB-NAN-MASK",
                     "SB-SCHED-PER-BATCH", "SB-EVAL-NO-TRAIN", "SB-SQUEEZE-ALL"}


def test_every_rule_says_what_to_check():
    assert all(len(rule.check) > 30 for rule in RULES.values())


@pytest.mark.parametrize("source, rule", [
    ("loss = F.mse_loss(pred, target)\n", "SB-BROADCAST"),
    ("y = x.unsqueeze(0)\n", "SB-EXPAND"),
    ("w = layer.weight.data\n", "SB-DATA-READ"),
    ("p.requires_grad = False\n", "SB-FREEZE"),
    ("crit = nn.CrossEntropyLoss()\n", "SB-CE-NO-WEIGHT"),
    ("(-loss).backward()\n", "SB-LOSS-SIGN"),
    ("class M:\n    def forward(self, x):\n        x.add_(1)\n        return x\n", "SB-INPLACE-FORWARD"),
    ("def compute_loss(x):\n    logged = x.sum().item()\n    return x.sum()\n", "SB-LOSS-ITEM"),
    ("y = x.astype(jnp.int8)\n", "SB-JAX-ASTYPE"),
    ("import jax\n@jax.jit\ndef f(x):\n    x[0] = 1\n    return x\n", "SB-JAX-SETITEM"),
])
def test_each_look_here_rule_alone(tmp_path, source, rule):
    assert rules(tmp_path, source) == []
    assert rules(tmp_path, source, show_all=True) == [rule]
