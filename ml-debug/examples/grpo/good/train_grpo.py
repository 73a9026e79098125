"""GRPO on grade-school maths: a minimal loop in the shape of TRL's GRPOTrainer.

Example training script for the ml-debug example set; it is read by scan_silent_bugs.py, not run.
"""
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader


def token_logps(model, input_ids, attention_mask, n_completion):
    """Log-probability of each completion token under `model`."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logits = logits[:, -n_completion - 1:-1, :].float()
    targets = input_ids[:, -n_completion:]
    logps = logits.log_softmax(dim=-1)
    return torch.gather(logps, 2, targets.unsqueeze(-1)).squeeze(-1)


def group_advantages(rewards, group_size):
    """Reward minus its group mean, over the group's standard deviation."""
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)
    return ((grouped - mean) / (std + 1e-4)).view(-1)


def grpo_loss(policy, ref_model, batch, beta, eps):
    """Clipped surrogate with a KL penalty to the reference model, averaged over tokens."""
    n = batch["completion_mask"].size(1)
    logps = token_logps(policy, batch["input_ids"], batch["attention_mask"], n)
    with torch.no_grad():
        ref_logps = token_logps(ref_model, batch["input_ids"], batch["attention_mask"], n)
    old_logps = logps.detach()
    ratio = torch.exp(logps - old_logps)
    adv = batch["advantages"].unsqueeze(1)
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
    kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
    per_token = -(surrogate - beta * kl)
    mask = batch["completion_mask"]
    return ((per_token * mask).sum(dim=1) / mask.sum(dim=1)).mean(), kl


def train(policy, ref_model, dataset, optimizer, scheduler, reward_fn, args, log):
    """One pass over the prompts: sample a group per prompt, score it, update the policy."""
    loader = DataLoader(dataset, batch_size=args.prompts_per_step, shuffle=True)
    ref_model.eval()
    policy.train()
    for step, prompts in enumerate(loader, 1):
        batch = args.rollout(policy, prompts, args.num_generations)
        rewards = reward_fn(batch["completions"], prompts["answer"])
        batch["advantages"] = group_advantages(rewards, args.num_generations)
        loss, kl = grpo_loss(policy, ref_model, batch, args.beta, args.eps)
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        log({"step": step, "loss": loss.item(), "grad_norm": grad_norm.item(),
             "reward": rewards.mean().item(), "kl": kl.mean().item()})
        if step % args.eval_every == 0:
            policy.eval()
            with torch.no_grad():
                acc = args.evaluate(policy)
            policy.train()
            log({"step": step, "eval_accuracy": acc})
