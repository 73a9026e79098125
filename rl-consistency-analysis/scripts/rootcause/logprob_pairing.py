"""Pair the rollout's and the trainer's sequences: by id when both files carry ids, else by order;
then check that both sides scored the same token ids.

Sequences whose token ids differ (re-tokenisation, a chat template applied on one side) are kept
aside as a finding of their own; only sequences with the same ids enter the metrics.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .logprob_inputs import LogprobSide


@dataclass(frozen=True)
class Mismatch:
    """A sequence both sides hold but scored with different token ids."""

    id: str
    rollout_tokens: int
    train_tokens: int
    first_differing_position: int | None     # None: one is a prefix of the other


@dataclass(frozen=True)
class Paired:
    """The sequences both sides scored with the same token ids, laid end to end (rollout order)."""

    ids: tuple[str, ...]
    offsets: np.ndarray
    token_ids: np.ndarray
    rollout: np.ndarray            # log-prob of the sampled token, rollout side
    train: np.ndarray
    rollout_top: tuple | None      # (ids [N, k], log-probs [N, k]) where the side gave top-k
    train_top: tuple | None
    rollout_ranks: np.ndarray | None
    prompt_lengths: np.ndarray | None   # per paired sequence, where a side gave every prompt
    paired_by: str                 # "id" or "order"
    mismatched: tuple[Mismatch, ...]
    rollout_only: tuple[str, ...]
    train_only: tuple[str, ...]

    @property
    def tokens(self) -> int:
        return int(self.token_ids.size)

    def position_in_sequence(self) -> np.ndarray:
        """Response position (0 = first response token) of every paired token (read-only: computed
        once, since the metrics, the patterns and the per-position view all ask for it)."""
        pos = self.__dict__.get("_position_in_sequence")
        if pos is None:
            pos = np.arange(self.tokens) - np.repeat(self.offsets[:-1], np.diff(self.offsets))
            pos.flags.writeable = False
            object.__setattr__(self, "_position_in_sequence", pos)     # frozen: set past __setattr__
        return pos

    def absolute_position(self) -> np.ndarray | None:
        """Position in prompt + response of every paired token, where the prompt lengths are known."""
        if self.prompt_lengths is None:
            return None
        return self.position_in_sequence() + np.repeat(self.prompt_lengths, np.diff(self.offsets))

    def sequence_of_token(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.ids)), np.diff(self.offsets))


def _gather(side: LogprobSide, order: np.ndarray) -> np.ndarray:
    """Flat indices of ``side``'s tokens for its sequences in ``order``."""
    starts, ends = side.offsets[order], side.offsets[order + 1]
    lengths = ends - starts
    if lengths.sum() == 0:
        return np.zeros(0, np.int64)
    base = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return base + np.arange(int(lengths.sum()))


def _prompt_lengths(side: LogprobSide, idx: list) -> np.ndarray | None:
    if side.prompt_ids is None or any(side.prompt_ids[i] is None for i in idx):
        return None
    return np.array([len(side.prompt_ids[i]) for i in idx], np.int64)


def _top(side: LogprobSide, idx: np.ndarray):
    if side.top_ids is None:
        return None
    return side.top_ids[idx], side.top_logprobs[idx]


def pair(rollout: LogprobSide, train: LogprobSide) -> Paired:
    """Pair the two sides' sequences and keep those that scored the same token ids."""
    if rollout.ids_given and train.ids_given:
        by = "id"
        where = {sid: i for i, sid in enumerate(train.ids)}
        r_idx = [i for i, sid in enumerate(rollout.ids) if sid in where]
        t_idx = [where[rollout.ids[i]] for i in r_idx]
        r_only = tuple(sid for sid in rollout.ids if sid not in where)
        t_only = tuple(sid for sid in train.ids if sid not in set(rollout.ids))
    else:
        by = "order"
        n = min(rollout.sequences, train.sequences)
        r_idx, t_idx = list(range(n)), list(range(n))
        r_only, t_only = rollout.ids[n:], train.ids[n:]
    r_idx, t_idx = np.array(r_idx, np.int64), np.array(t_idx, np.int64)
    r_len = rollout.offsets[r_idx + 1] - rollout.offsets[r_idx]
    t_len = train.offsets[t_idx + 1] - train.offsets[t_idx]
    same = r_len == t_len
    # Token ids compared for all equal-length pairs at once: one mismatch count per pair.
    a, b = rollout.token_ids[_gather(rollout, r_idx[same])], train.token_ids[_gather(train, t_idx[same])]
    owner = np.repeat(np.arange(int(same.sum())), r_len[same])
    bad = np.bincount(owner[a != b], minlength=int(same.sum()))
    ok = np.zeros(r_idx.size, bool)
    ok[np.flatnonzero(same)] = bad == 0
    mismatched = []
    for ri, ti in zip(r_idx[~ok], t_idx[~ok]):
        a = rollout.token_ids[rollout.offsets[ri]:rollout.offsets[ri + 1]]
        b = train.token_ids[train.offsets[ti]:train.offsets[ti + 1]]
        m = min(a.size, b.size)
        diff = np.flatnonzero(a[:m] != b[:m])
        mismatched.append(Mismatch(rollout.ids[ri], int(a.size), int(b.size), int(diff[0]) if diff.size else None))
    keep_r, keep_t = r_idx[ok].tolist(), t_idx[ok].tolist()
    kr, kt = np.array(keep_r, np.int64), np.array(keep_t, np.int64)
    ir, it = _gather(rollout, kr), _gather(train, kt)
    lengths = rollout.offsets[kr + 1] - rollout.offsets[kr]
    offsets = np.zeros(kr.size + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Paired(ids=tuple(rollout.ids[i] for i in keep_r), offsets=offsets, token_ids=rollout.token_ids[ir],
                  rollout=rollout.logprobs[ir], train=train.logprobs[it], rollout_top=_top(rollout, ir),
                  train_top=_top(train, it), rollout_ranks=None if rollout.ranks is None else rollout.ranks[ir],
                  prompt_lengths=_prompt_lengths(rollout, keep_r) if rollout.prompt_ids is not None
                  else _prompt_lengths(train, keep_t),
                  paired_by=by, mismatched=tuple(mismatched), rollout_only=tuple(r_only), train_only=tuple(t_only))
