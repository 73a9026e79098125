"""scan_silent_bugs on code shaped like real training code: a good and a bad version per pattern.

Each snippet is our own code in the shape of a well-known implementation, named next to it:
- HF Trainer loss: huggingface/transformers, src/transformers/trainer.py (Trainer.compute_loss)
- TRL GRPO loss: huggingface/trl, trl/trainer/grpo_trainer.py (the per-token log-prob ratio
  against a detached copy, and the reference model run without gradients)
- verl policy loss: volcengine/verl, verl/trainer/ppo/core_algos.py (compute_policy_loss: the
  ratio is exp(log_prob - old_log_prob))
- plain PyTorch loops: pytorch/examples, mnist/main.py (log_softmax then nll_loss) and
  dcgan/main.py (the discriminator step on a detached fake batch)
"""
import textwrap

import pytest

from scan_silent_bugs import expand, scan_file
from mldebug_common import InputError

HF_TRAINER = '''
import torch.nn.functional as F
from transformers import Trainer


class MyTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits[:, :-1, :].float()
        {body}
        return loss
'''
HF_GOOD = "loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))"
HF_BAD = [
    # probabilities reshaped with view before the loss
    "probs = logits.softmax(-1)\n        loss = F.cross_entropy(probs.view(-1, probs.size(-1)), labels.view(-1))",
    # flatten(0, 1) and a cast in between
    "probs = F.softmax(logits, dim=-1).float()\n        flat = probs.flatten(0, 1)\n"
    "        loss = F.cross_entropy(flat, labels[:, 1:].flatten())",
    # a criterion held on self, fed an indexed slice of probabilities
    "self.criterion = torch.nn.CrossEntropyLoss()\n        p = torch.softmax(logits, -1)\n"
    "        loss = self.criterion(p[:, -1], labels[:, -1])",
]

TRL_GRPO = '''
import torch


def compute_loss(self, model, inputs):
    per_token_logps = self.get_per_token_logps(model, inputs["input_ids"], inputs["attention_mask"])
    with torch.no_grad():
        ref_per_token_logps = self.get_per_token_logps(self.ref_model, inputs["input_ids"],
                                                       inputs["attention_mask"])
    {body}
    advantages = inputs["advantages"].unsqueeze(1)
    per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    per_token_loss = -(coef_1 * advantages - self.beta * per_token_kl)
    loss = (per_token_loss * inputs["completion_mask"]).sum() / inputs["completion_mask"].sum()
    self.metrics["kl"].append(per_token_kl.mean().detach().item())
    return loss


def train(self, loader, optimizer):
    for inputs in loader:
        loss = compute_loss(self, self.model, inputs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''
TRL_GOOD = [
    "old_per_token_logps = per_token_logps.detach()\n    coef_1 = torch.exp(per_token_logps - old_per_token_logps)",
    "coef_1 = torch.exp(per_token_logps - per_token_logps.detach())",
]
TRL_BAD = "coef_1 = torch.exp(per_token_logps.detach() - inputs['old_per_token_logps'])"

VERL = '''
import torch


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio=0.2):
    {body}
    ratio = torch.exp(negative_approx_kl)
    pg_losses = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio))
    return (pg_losses * response_mask).sum() / response_mask.sum()
'''
VERL_GOOD = "negative_approx_kl = log_prob - old_log_prob"
VERL_BAD = "negative_approx_kl = log_prob.detach() - old_log_prob"

MNIST = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def forward(self, x):
        x = self.fc2(F.relu(self.fc1(x)))
        {forward}


def train(model, loader, optimizer):
    model.train()
    for data, target in loader:
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()


def test(model, loader):
    model.eval()
    with torch.no_grad():
        for data, target in loader:
            pred = model(data).argmax(dim=1)
'''

DCGAN = '''
import torch


def train(netD, netG, loader, optimizerD, optimizerG, criterion, nz):
    for real, _ in loader:
        netD.zero_grad()
        err_real = criterion(netD(real).view(-1), torch.ones(real.size(0)))
        err_real.backward()
        noise = torch.randn(real.size(0), nz, 1, 1)
        fake = netG(noise)
        {body}
        err_fake.backward()
        optimizerD.step()
        netG.zero_grad()
        err_g = criterion(netD(fake).view(-1), torch.ones(real.size(0)))
        err_g.backward()
        optimizerG.step()
'''
DCGAN_GOOD = "err_fake = criterion(netD(fake.detach()).view(-1), torch.zeros(real.size(0)))"
DCGAN_BAD = "err_fake = criterion(netD(netG.body(noise).detach()).view(-1), torch.zeros(real.size(0)))"

REF_NO_GRAD = '''
import torch


def distill_step(student, teacher_model, batch, optimizer):
    with torch.no_grad():
        teacher_logits = teacher_model(batch)
    loss = torch.nn.functional.kl_div(student(batch).log_softmax(-1), teacher_logits.softmax(-1),
                                      reduction="batchmean")
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''


def rules(tmp_path, source, show_all=False):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(source))
    return [f.rule for f in scan_file(str(path), show_all)[0]]


def fill(template, **parts):
    return template.replace("{body}", parts.get("body", "")).replace("{forward}", parts.get("forward", ""))


def test_hf_trainer_logits_to_cross_entropy_is_clean(tmp_path):
    assert rules(tmp_path, fill(HF_TRAINER, body=HF_GOOD)) == []


@pytest.mark.parametrize("body", HF_BAD)
def test_hf_trainer_probabilities_reach_cross_entropy_however_reshaped(tmp_path, body):
    assert rules(tmp_path, fill(HF_TRAINER, body=body)) == ["SB-SOFTMAX-CE"]


def test_softmax_cross_entropy_message_names_where_the_probabilities_were_made(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(fill(HF_TRAINER, body=HF_BAD[0])))
    (finding,) = scan_file(str(path), False)[0]
    assert "its input is probabilities (made on line 11) and cross_entropy normalises again" in finding.message


def test_a_reassigned_name_no_longer_carries_probabilities(tmp_path):
    body = "probs = logits.softmax(-1)\n        probs = logits\n        loss = F.cross_entropy(probs, labels)"
    assert rules(tmp_path, fill(HF_TRAINER, body=body)) == []


@pytest.mark.parametrize("body", TRL_GOOD)
def test_trl_grpo_detached_old_logps_is_an_idiom(tmp_path, body):
    assert rules(tmp_path, fill(TRL_GRPO, body=body)) == []


def test_trl_grpo_detaching_the_current_logps_is_flagged(tmp_path):
    assert rules(tmp_path, fill(TRL_GRPO, body=TRL_BAD)) == ["SB-DETACH"]


def test_verl_policy_loss(tmp_path):
    assert rules(tmp_path, fill(VERL, body=VERL_GOOD)) == []
    assert rules(tmp_path, fill(VERL, body=VERL_BAD)) == ["SB-DETACH"]


def test_mnist_log_softmax_with_nll_is_clean_and_softmax_is_not(tmp_path):
    assert rules(tmp_path, fill(MNIST, forward="return F.log_softmax(x, dim=1)")) == []
    assert rules(tmp_path, fill(MNIST, forward="return F.softmax(x, dim=1)")) == ["SB-SOFTMAX-CE"]


def test_dcgan_detached_fake_batch_is_an_idiom(tmp_path):
    assert rules(tmp_path, fill(DCGAN, body=DCGAN_GOOD)) == []
    assert rules(tmp_path, fill(DCGAN, body=DCGAN_BAD)) == ["SB-DETACH"]


def test_no_grad_reference_forward_is_not_an_evaluation(tmp_path):
    assert rules(tmp_path, REF_NO_GRAD) == []
    evaluation = REF_NO_GRAD.replace("teacher_logits = teacher_model(batch)", "val = student(batch)")
    assert rules(tmp_path, evaluation) == ["SB-NO-EVAL"]


def test_all_does_not_call_a_dataloader_import_a_data_read(tmp_path):
    source = ("from torch.utils.data import DataLoader\nimport torch.utils.data\n"
              "loader = torch.utils.data.DataLoader(ds)\nw = layer.weight.data\n")
    path = tmp_path / "train.py"
    path.write_text(source)
    found = [(f.line, f.rule) for f in scan_file(str(path), True)[0]]
    assert found == [(4, "SB-DATA-READ")]


def test_wrong_kind_or_empty_file_is_an_input_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "empty.py").write_text("\n")
    for name, message in (("empty.jsonl", "not a Python file"), ("metrics.jsonl", "not a Python file"),
                          ("empty.py", "empty file, nothing to scan")):
        with pytest.raises(InputError, match=message):
            expand([str(tmp_path / name)])


def test_idiom_names_match_whole_name_parts_only(tmp_path):
    # `threshold` holds "old" and `prefix_model` holds "ref" as letters, not as name parts.
    source = ("import torch\n\ndef step(threshold, x):\n    return torch.exp(threshold.detach() - x)\n")
    assert rules(tmp_path, source) == ["SB-DETACH"]
    assert rules(tmp_path, REF_NO_GRAD.replace("teacher_model", "prefix_model")) == ["SB-NO-EVAL"]
    assert rules(tmp_path, REF_NO_GRAD.replace("teacher_model", "refModel")) == []
