"""Supervised fine-tuning for ticket routing, in the shape of a Hugging Face Trainer subclass.

Example training script for the ml-debug example set; it is read by scan_silent_bugs.py, not run.
The model answers each support ticket with one queue label; the loss covers the label tokens only.
"""
import torch
import torch.nn.functional as F
from transformers import Trainer

IGNORE = -100


def mask_prompt(input_ids, prompt_lengths):
    """Labels equal to the inputs, with every prompt position set to IGNORE."""
    labels = input_ids.clone()
    for row, n in enumerate(prompt_lengths):
        labels[row, :n] = IGNORE
    return labels


class LabelOnlyTrainer(Trainer):
    """Trainer whose loss is the next-token cross-entropy on the answer tokens."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits[:, :-1, :].float()
        targets = labels[:, 1:]
        probs = logits.softmax(-1)
        vocab = probs.size(-1)
        loss = F.cross_entropy(probs.view(-1, vocab), targets.reshape(-1), ignore_index=IGNORE)
        return (loss, outputs) if return_outputs else loss


def overfit_check(model, batch, optimizer, steps, log):
    """Train on one fixed batch of 20 rows until the loss is near zero (P2 step 6)."""
    model.train()
    for step in range(steps):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        logits = out.logits[:, :-1, :]
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten(),
                               ignore_index=IGNORE)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        log({"step": step, "loss": loss.item()})
