"""Clipped policy-gradient loss shared by the PPO and GRPO trainers of this project."""
import torch


def policy_loss(logp, old_logp, advantages, mask, clip=0.2):
    """Token-level clipped surrogate, averaged over the response tokens of the batch."""
    ratio = torch.exp(logp.detach() - old_logp)
    clipped = torch.clamp(ratio, 1 - clip, 1 + clip)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    return (per_token * mask).sum() / mask.sum()


def grpo_step(policy, batch, optimizer, old_logp=None):
    """One update; with a single update per batch the old policy is the current one."""
    logits = policy(batch["input_ids"]).logits[:, :-1]
    logp = torch.gather(logits.log_softmax(-1), 2, batch["input_ids"][:, 1:, None]).squeeze(-1)
    rewards = batch["rewards"]
    advantages = ((rewards - rewards.mean()) / (rewards.std() + 1e-6))[:, None]
    if old_logp is None:
        loss = policy_loss(logp, logp.detach(), advantages, batch["mask"])
    else:
        loss = policy_loss(logp, old_logp, advantages, batch["mask"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
