"""Typed containers that flow between the stages of a GRPO step.

Notation: ``B`` groups (prompts), ``G`` completions per group, ``N = B * G`` sequences, ``P`` prompt length
(left-padded), ``L`` completion length (right-padded). Completions of group ``b`` are rows ``b*G .. b*G+G-1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np
import torch
from torch import Tensor

from lit_rlft.core.advantages import success_rates


def pad_to(x: Tensor, length: int, value: float, left: bool = False) -> Tensor:
    """Pad the last dim of ``x`` ``[..., T]`` to ``[..., length]`` (``length >= T``)."""
    extra = length - x.shape[-1]
    if extra <= 0:
        return x
    pad = x.new_full((*x.shape[:-1], extra), value)
    return torch.cat([pad, x] if left else [x, pad], dim=-1)


_GROUP_FIELDS = ("prompt_ids", "rewards", "correct", "birth_step", "is_replay")
_SCALAR_FIELDS = ("pad_id", "generation_s")


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Token lists -> ``(ids [n, T], mask [n, T])`` left-padded to the longest row (``T``)."""
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, length - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, length - len(r):] = 1
    return ids, mask


@dataclass
class Rollouts:
    """One rollout batch: ``B`` groups of ``G`` completions, fresh or replayed.

    ``behaviour_logprobs`` holds, for every row, the per-token log-probs of mu, the policy that sampled it. The rule:
    a replayed row keeps the mu it was stored with; a fresh row's mu is the engine's sampling log-probs
    (``engine_logprobs``) when the engine reports them (vLLM: its own copy of the weights), else pi_old, the policy
    before this step's update (``HFEngine`` samples with the policy itself). The policy update produces it (pi_old is
    known only once its forward pass has run: ``UpdateOutput.behaviour_logprobs``), and the step returns the batch with
    it (``StepOutput.rollouts``), complete; the replay buffer stores it from there.

    ``reward_per_func`` holds each reward function's unweighted scores (NaN rows for groups that were not scored
    here, such as replayed ones); ``generation_s`` is the wall time the engine spent generating these rows.

    Groups of different sizes (per-prompt allocation: sequential sampling, budgeted allocation) are padded to the
    widest, ``G = G_max``: ``members`` ``[B, G]`` marks each group's real completions, a prefix of its rows; a padding
    row has no prompt or completion tokens (masks 0), reward 0, ``correct`` False and empty text, and the update never
    passes it through the model. ``members`` is None when every group is full (everything is then computed as before
    groups of different sizes existed). :meth:`member_rows` lists the real rows, :attr:`num_completions` counts them.
    """

    prompt_ids: Tensor  # [B] long, stable pool ids
    prompt_tokens: Tensor  # [N, P] long, left-padded with pad_id
    prompt_mask: Tensor  # [N, P] long
    completion_tokens: Tensor  # [N, L] long, right-padded with pad_id
    completion_mask: Tensor  # [N, L] long, 1 on generated tokens (EOS included)
    rewards: Tensor  # [B, G] float32, total (possibly shaped) reward
    correct: Tensor  # [B, G] bool, reward >= success_threshold
    birth_step: Tensor  # [B] long, step that generated the group
    is_replay: Tensor  # [B] bool
    truncated: Tensor  # [N] bool, stopped by max_new_tokens rather than EOS
    behaviour_logprobs: Tensor | None = None  # [N, L] float32, log mu of every row (the rule above; None: not yet)
    engine_logprobs: Tensor | None = None  # [N, L] float32, the engine's sampling log-probs (None: not reported)
    reward_per_func: dict[str, Tensor] = field(default_factory=dict)  # name -> [B, G] float32, unweighted
    completions: list[str] = field(default_factory=list)  # [N] decoded text, for logging
    prompts: list[str] = field(default_factory=list)  # [B] prompt text, for logging
    pad_id: int = 0
    generation_s: float = 0.0  # engine wall time spent on these rows
    members: Tensor | None = None  # [B, G] bool, the real completions, a prefix of each group (None: all)
    policy_mask: Tensor | None = None  # [N, L] long, 1 on the policy's own tokens (None: completion_mask)

    @property
    def loss_mask(self) -> Tensor:
        """``[N, L]`` long: the tokens the loss, the entropy and the KL are taken over: the policy's own tokens.

        Multi-turn episodes (:mod:`lit_rlft.rollout.episodes`) hold observations (tool results, an environment's
        messages) inside the completion: they are context (``completion_mask`` 1, attended to and positioned) but not
        the policy's actions (``policy_mask`` 0). Single-turn rollouts have no ``policy_mask``: it is the
        completion mask."""
        return self.completion_mask if self.policy_mask is None else self.policy_mask

    @property
    def num_groups(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def group_size(self) -> int:
        """``G``: the width of the groups (the widest group's size when ``members`` is set)."""
        return int(self.rewards.shape[1])

    @property
    def num_completions(self) -> int:
        """Real completions (rows that are members)."""
        return int(self.completion_tokens.shape[0]) if self.members is None else int(self.members.sum())

    @property
    def group_sizes(self) -> Tensor:
        """``[B]`` long: each group's real completions."""
        return self.member_mask().sum(1)

    @property
    def success_rates(self) -> Tensor:
        """``[B]`` fraction of each group's completions that are correct (of its members)."""
        return success_rates(self.correct, self.members)

    def member_mask(self) -> Tensor:
        """``[B, G]`` bool: :attr:`members`, or all True."""
        return self.members if self.members is not None else torch.ones(self.rewards.shape, dtype=torch.bool)

    def member_rows(self) -> Tensor:
        """``[N_real]`` long: the rows that are real completions, in order (all ``N`` rows without ``members``)."""
        if self.members is None:
            return torch.arange(self.completion_tokens.shape[0])
        return torch.nonzero(self.members.reshape(-1)).flatten()

    def regroup(self, rows: Tensor, groups: Tensor) -> Rollouts:
        """A batch whose group ``b`` holds this batch's rows ``rows[b]`` (``[B', W]`` flat row indices, ``-1`` for
        padding after the real ones) and the group fields (prompt id, birth step, replay flag, prompt text) of this
        batch's group ``groups[b]`` (``[B']``). The one primitive behind padding groups to a width and joining
        completions of one prompt generated in several calls."""
        rows, groups = torch.as_tensor(rows, dtype=torch.long), torch.as_tensor(groups, dtype=torch.long)
        members = rows >= 0  # [B', W]
        if members.shape[0] and not bool(members[:, 0].all()):
            raise ValueError("regroup: every group needs at least one row, listed first")
        flat, pad = rows.reshape(-1).clamp(min=0), ~members.reshape(-1)  # [B' * W]

        def per_row(t: Tensor | None, value: float) -> Tensor | None:
            if t is None:
                return None
            out = t[flat].clone()
            out[pad] = value
            return out

        def per_slot(t: Tensor, value: float) -> Tensor:
            return per_row(t.reshape(-1), value).reshape(rows.shape)

        return Rollouts(
            prompt_ids=self.prompt_ids[groups],
            prompt_tokens=per_row(self.prompt_tokens, self.pad_id),
            prompt_mask=per_row(self.prompt_mask, 0),
            completion_tokens=per_row(self.completion_tokens, self.pad_id),
            completion_mask=per_row(self.completion_mask, 0),
            rewards=per_slot(self.rewards, 0.0),
            correct=per_slot(self.correct, False),
            birth_step=self.birth_step[groups],
            is_replay=self.is_replay[groups],
            truncated=per_row(self.truncated, False),
            behaviour_logprobs=per_row(self.behaviour_logprobs, 0.0),
            engine_logprobs=per_row(self.engine_logprobs, 0.0),
            reward_per_func={k: per_slot(v, float("nan")) for k, v in self.reward_per_func.items()},
            completions=[self.completions[i] if real else "" for i, real in
                         zip(flat.tolist(), (~pad).tolist())] if self.completions else [],
            prompts=[self.prompts[i] for i in groups.tolist()] if self.prompts else [],
            pad_id=self.pad_id,
            generation_s=self.generation_s,
            members=None if bool(members.all()) else members,
            policy_mask=per_row(self.policy_mask, 0),
        )

    def widen(self, width: int) -> Rollouts:
        """Every group padded with padding rows to ``width`` completions (``width >= G``; see :meth:`regroup`)."""
        if width == self.group_size:
            return self
        rows = torch.arange(self.completion_tokens.shape[0]).reshape(self.num_groups, self.group_size)
        rows = torch.where(self.member_mask(), rows, -1)
        return self.regroup(pad_to(rows, width, -1), torch.arange(self.num_groups))

    @staticmethod
    def join(parts: list[Rollouts]) -> Rollouts:
        """The completions of each prompt of ``parts[0]`` gathered from every part into one group, in part order:
        for completions of one prompt generated in several calls (sequential sampling's rounds). A later part holds
        any subset of the first part's prompts (each prompt once per part); groups may end up of different sizes.
        Group fields are the first part's; the generation time is the sum."""
        parts = parts[:1] + [p for p in parts[1:] if p.num_groups > 0]
        first = parts[0]
        flat = Rollouts.concat(parts)  # every part's groups, padded to the widest
        width = flat.group_size
        where, offsets, longest = _join_layout(first.prompt_ids, [p.prompt_ids for p in parts],
                                               [p.member_mask() for p in parts])
        index = torch.full((first.num_groups, longest), -1, dtype=torch.long)  # [B, W] flat rows of `flat`
        base = 0
        for part, b, off in zip(parts, where, offsets):
            j, c = torch.nonzero(part.member_mask(), as_tuple=True)  # the part's real slots
            index[b[j], off[j] + c] = (base + j) * width + c
            base += part.num_groups
        out = flat.regroup(index, torch.arange(first.num_groups))
        out.generation_s = sum(p.generation_s for p in parts)
        return out

    def select_groups(self, index: Tensor | list[int]) -> Rollouts:
        """The groups at ``index`` (``[b]``), in that order (as wide as this batch)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        g = self.group_size
        rows = (idx[:, None] * g + torch.arange(g)[None, :]).reshape(-1)
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _SCALAR_FIELDS:
                out[f.name] = v
            elif f.name == "reward_per_func":
                out[f.name] = {k: t[idx] for k, t in v.items()}
            elif f.name == "completions":
                out[f.name] = [v[i] for i in rows.tolist()] if v else []
            elif f.name == "prompts":
                out[f.name] = [v[i] for i in idx.tolist()] if v else []
            elif v is None:
                out[f.name] = None
            elif f.name == "members":
                out[f.name] = None if bool(v[idx].all()) else v[idx]
            elif f.name in _GROUP_FIELDS:
                out[f.name] = v[idx]
            else:
                out[f.name] = v[rows]
        return Rollouts(**out)

    @staticmethod
    def concat(parts: list[Rollouts]) -> Rollouts:
        """Concatenate rollout batches along groups, re-padding prompts (left) and completions (right); batches of
        different group widths are padded to the widest (:meth:`widen`, ``members``)."""
        parts = [p for p in parts if p.num_groups > 0] or parts[:1]
        if len(parts) == 1:
            return parts[0]
        width = max(p.group_size for p in parts)
        ragged = any(p.members is not None or p.group_size != width for p in parts)
        parts = [p.widen(width) for p in parts]
        pad = parts[0].pad_id
        p_len = max(p.prompt_tokens.shape[1] for p in parts)
        c_len = max(p.completion_tokens.shape[1] for p in parts)
        cat = torch.cat

        def cat_optional(name: str) -> Tensor | None:
            values = [getattr(p, name) for p in parts]
            if all(v is None for v in values):
                return None
            return cat([
                pad_to(v, c_len, 0.0) if v is not None else torch.zeros(p.completion_tokens.shape[0], c_len)
                for v, p in zip(values, parts)
            ])

        return Rollouts(
            prompt_ids=cat([p.prompt_ids for p in parts]),
            prompt_tokens=cat([pad_to(p.prompt_tokens, p_len, pad, left=True) for p in parts]),
            prompt_mask=cat([pad_to(p.prompt_mask, p_len, 0, left=True) for p in parts]),
            completion_tokens=cat([pad_to(p.completion_tokens, c_len, pad) for p in parts]),
            completion_mask=cat([pad_to(p.completion_mask, c_len, 0) for p in parts]),
            rewards=cat([p.rewards for p in parts]),
            correct=cat([p.correct for p in parts]),
            birth_step=cat([p.birth_step for p in parts]),
            is_replay=cat([p.is_replay for p in parts]),
            truncated=cat([p.truncated for p in parts]),
            behaviour_logprobs=cat_optional("behaviour_logprobs"),
            engine_logprobs=cat_optional("engine_logprobs"),
            reward_per_func=_cat_per_func([p.reward_per_func for p in parts], [p.rewards for p in parts]),
            completions=[c for p in parts for c in p.completions],
            prompts=[c for p in parts for c in p.prompts],
            pad_id=pad,
            generation_s=sum(p.generation_s for p in parts),
            members=cat([p.member_mask() for p in parts]) if ragged else None,
            policy_mask=None if all(p.policy_mask is None for p in parts)
            else cat([pad_to(p.loss_mask, c_len, 0) for p in parts]),
        )


    def extend_groups(self, more: Rollouts) -> Rollouts:
        """Each group with ``more``'s completions of the same prompt appended: ``G + G'`` completions per group.

        For completions of one prompt generated in two calls (screening, then the rest). ``more`` holds the same
        prompts in the same order (``G'`` completions each); its rows follow this one's in every group. Group fields
        (birth step, replay flag, prompt text) are this one's; the generation time is the sum.
        """
        if not torch.equal(self.prompt_ids, more.prompt_ids):
            raise ValueError(f"extend_groups needs the same prompts in the same order, got {self.prompt_ids.tolist()} "
                             f"and {more.prompt_ids.tolist()}")
        if self.members is not None or more.members is not None:
            return Rollouts.join([self, more])
        B, g, h = self.num_groups, self.group_size, more.group_size
        p_len = max(self.prompt_tokens.shape[1], more.prompt_tokens.shape[1])
        c_len = max(self.completion_tokens.shape[1], more.completion_tokens.shape[1])

        def rows(a: Tensor | None, b: Tensor | None, width: int | None = None, value: float = 0,
                 left: bool = False) -> Tensor | None:
            """Per-row ``[B*g, ...]`` and ``[B*h, ...]`` -> ``[B*(g+h), ...]``, group by group."""
            if a is None and b is None:
                return None
            if width is not None:
                a = pad_to(a, width, value, left) if a is not None else torch.zeros(B * g, width)
                b = pad_to(b, width, value, left) if b is not None else torch.zeros(B * h, width)
            return torch.cat([a.reshape(B, g, *a.shape[1:]), b.reshape(B, h, *b.shape[1:])], 1).reshape(
                B * (g + h), *a.shape[1:])

        pad = self.pad_id
        names = list(dict.fromkeys([*self.reward_per_func, *more.reward_per_func]))
        nan = float("nan")
        return Rollouts(
            prompt_ids=self.prompt_ids,
            prompt_tokens=rows(self.prompt_tokens, more.prompt_tokens, p_len, pad, left=True),
            prompt_mask=rows(self.prompt_mask, more.prompt_mask, p_len, 0, left=True),
            completion_tokens=rows(self.completion_tokens, more.completion_tokens, c_len, pad),
            completion_mask=rows(self.completion_mask, more.completion_mask, c_len, 0),
            rewards=torch.cat([self.rewards, more.rewards], 1),
            correct=torch.cat([self.correct, more.correct], 1),
            birth_step=self.birth_step,
            is_replay=self.is_replay,
            truncated=rows(self.truncated, more.truncated),
            behaviour_logprobs=rows(self.behaviour_logprobs, more.behaviour_logprobs, c_len),
            engine_logprobs=rows(self.engine_logprobs, more.engine_logprobs, c_len),
            reward_per_func={k: torch.cat([self.reward_per_func.get(k, torch.full((B, g), nan)),
                                           more.reward_per_func.get(k, torch.full((B, h), nan))], 1) for k in names},
            completions=[c for b in range(B) for c in (self.completions[b * g:(b + 1) * g] +
                                                       more.completions[b * h:(b + 1) * h])]
            if self.completions and more.completions else [],
            prompts=self.prompts,
            pad_id=pad,
            generation_s=self.generation_s + more.generation_s,
            policy_mask=None if self.policy_mask is None and more.policy_mask is None
            else rows(self.loss_mask, more.loss_mask, c_len, 0),
        )


def _join_layout(first_ids: Tensor, ids: list[Tensor], masks: list[Tensor]) -> tuple[list[Tensor], list[Tensor], int]:
    """Where each part's groups go when joined by prompt (:meth:`Rollouts.join`): for every part, the ``[b_k]`` row of
    ``first_ids`` ``[B]`` each of its groups joins and the ``[b_k]`` slot its first completion lands in (after the
    earlier parts' completions of the same prompt); and the widest joined group."""
    order = torch.argsort(first_ids)
    sorted_ids = first_ids[order]
    filled = torch.zeros(len(first_ids), dtype=torch.long)  # [B] completions placed so far
    where, offsets = [], []
    for part_ids, mask in zip(ids, masks):
        pos = torch.searchsorted(sorted_ids, part_ids).clamp(max=max(len(first_ids) - 1, 0))
        if len(part_ids) and not bool((sorted_ids[pos] == part_ids).all()):
            missing = part_ids[sorted_ids[pos] != part_ids].tolist()
            raise ValueError(f"join: prompts {missing} of a later part are not in the first part")
        b = order[pos]  # [b_k]
        where.append(b)
        offsets.append(filled[b].clone())
        filled[b] += mask.sum(1)
    return where, offsets, int(filled.max()) if len(filled) else 0


def _cat_per_func(dicts: list[dict[str, Tensor]], rewards: list[Tensor]) -> dict[str, Tensor]:
    """Concatenate per-function ``[b, G]`` scores along groups; a part without a function gets NaN rows; parts of
    different widths are padded with NaN to the widest."""
    names = list(dict.fromkeys(k for d in dicts for k in d))
    width = max(r.shape[1] for r in rewards)
    return {
        k: torch.cat([pad_to(d[k], width, float("nan")) if k in d else torch.full((r.shape[0], width), float("nan"))
                      for d, r in zip(dicts, rewards)])
        for k in names
    }


@dataclass
class OutcomeRecord:
    """The outcome of every group a step rolled out, on every rank: what selection callbacks observe.

    One row per group (``n`` rows): the global training batch (fresh and replayed groups, all ranks) and the groups
    a rollout hook rolled out and did not train on (dynamic sampling's discarded candidates, ``trained = False``).
    Rows are in global order: for each generation call, rank 0's groups, then rank 1's, ... It holds no tokens, so
    gathering it costs little; every rank holds the same record, which is what keeps their selection states equal.

    Groups of different sizes (screening's first round beside full groups) are padded to the widest, ``G``, with
    ``members`` marking the real completions; :attr:`success_rates` counts members only. ``members`` is None when
    every group is full (then the record is what it was before groups of different sizes existed).
    """

    prompt_ids: Tensor  # [n] long
    rewards: Tensor  # [n, G] float32 (padding: 0)
    correct: Tensor  # [n, G] bool (padding: False)
    is_replay: Tensor  # [n] bool
    trained: Tensor  # [n] bool, part of the batch trained on
    reward_per_func: dict[str, Tensor] = field(default_factory=dict)  # name -> [n, G], NaN rows when not scored
    members: Tensor | None = None  # [n, G] bool, the real completions, a prefix of each row (None: all)

    @property
    def num_groups(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def success_rates(self) -> Tensor:
        """``[n]`` fraction of each group's completions that are correct (of its members)."""
        return success_rates(self.correct, self.members)

    def extend_groups(self, more: OutcomeRecord) -> OutcomeRecord:
        """Each group with ``more``'s outcomes of the same prompt appended (see :meth:`Rollouts.extend_groups`);
        both must be full groups."""
        if not torch.equal(self.prompt_ids, more.prompt_ids):
            raise ValueError("extend_groups needs the same prompts in the same order")
        if self.members is not None or more.members is not None:
            raise ValueError("extend_groups joins full groups only")
        n, g, h = self.num_groups, self.rewards.shape[1], more.rewards.shape[1]
        nan = float("nan")
        names = list(dict.fromkeys([*self.reward_per_func, *more.reward_per_func]))
        return replace(self, rewards=torch.cat([self.rewards, more.rewards], 1),
                       correct=torch.cat([self.correct, more.correct], 1),
                       reward_per_func={k: torch.cat([self.reward_per_func.get(k, torch.full((n, g), nan)),
                                                      more.reward_per_func.get(k, torch.full((n, h), nan))], 1)
                                        for k in names})

    @classmethod
    def from_rollouts(cls, rollouts: Rollouts, trained: bool = True) -> OutcomeRecord:
        """The record of one rank's rollouts (no tokens)."""
        return cls(
            prompt_ids=rollouts.prompt_ids.detach().cpu(),
            rewards=rollouts.rewards.detach().cpu(),
            correct=rollouts.correct.detach().cpu(),
            is_replay=rollouts.is_replay.detach().cpu(),
            trained=torch.full((rollouts.num_groups,), trained, dtype=torch.bool),
            reward_per_func={k: v.detach().cpu() for k, v in rollouts.reward_per_func.items()},
            members=None if rollouts.members is None else rollouts.members.detach().cpu(),
        )

    @staticmethod
    def concat(parts: list[OutcomeRecord]) -> OutcomeRecord:
        """Rows of ``parts`` in order; parts of different group sizes are padded to the widest (``members``)."""
        parts = [p for p in parts if p.num_groups > 0] or parts[:1]
        if len(parts) == 1:
            return parts[0]
        width = max(p.rewards.shape[1] for p in parts)
        ragged = any(p.members is not None or p.rewards.shape[1] != width for p in parts)
        return OutcomeRecord(
            prompt_ids=torch.cat([p.prompt_ids for p in parts]),
            rewards=torch.cat([pad_to(p.rewards, width, 0.0) for p in parts]),
            correct=torch.cat([pad_to(p.correct, width, False) for p in parts]),
            is_replay=torch.cat([p.is_replay for p in parts]),
            trained=torch.cat([p.trained for p in parts]),
            reward_per_func=_cat_per_func([p.reward_per_func for p in parts], [p.rewards for p in parts]),
            members=torch.cat([pad_to(p.member_mask(), width, False) for p in parts]) if ragged else None,
        )

    @staticmethod
    def join(parts: list[OutcomeRecord]) -> OutcomeRecord:
        """The outcomes of each prompt of ``parts[0]`` gathered from every part into one row, in part order (see
        :meth:`Rollouts.join`); the other fields are the first part's."""
        first = parts[0]
        masks = [p.member_mask() for p in parts]
        where, offsets, width = _join_layout(first.prompt_ids, [p.prompt_ids for p in parts], masks)
        n, nan = first.num_groups, float("nan")
        names = list(dict.fromkeys(k for p in parts for k in p.reward_per_func))
        rewards = torch.zeros(n, width, dtype=first.rewards.dtype)
        correct = torch.zeros(n, width, dtype=torch.bool)
        per_func = {k: torch.full((n, width), nan) for k in names}
        members = torch.zeros(n, width, dtype=torch.bool)
        for part, mask, b, off in zip(parts, masks, where, offsets):
            j, c = torch.nonzero(mask, as_tuple=True)
            dest = (b[j], off[j] + c)
            rewards[dest] = part.rewards[j, c].to(rewards.dtype)
            correct[dest] = part.correct[j, c]
            members[dest] = True
            for k, v in part.reward_per_func.items():
                per_func[k][dest] = v[j, c].float()
        return replace(first, rewards=rewards, correct=correct, reward_per_func=per_func,
                       members=None if bool(members.all()) else members)

    def member_mask(self) -> Tensor:
        """``[n, G]`` bool: :attr:`members`, or all True."""
        return self.members if self.members is not None else torch.ones(self.rewards.shape, dtype=torch.bool)

    def select(self, index: Tensor | np.ndarray | list[int]) -> OutcomeRecord:
        """The rows at ``index`` (``[k]`` positions or an ``[n]`` bool mask), in that order."""
        idx = torch.as_tensor(np.asarray(index))
        if idx.dtype == torch.bool:
            idx = torch.nonzero(idx).flatten()
        idx = idx.long()
        members, width = None, self.rewards.shape[1]
        if self.members is not None:  # members are prefixes: cut to the widest group selected
            members = self.members[idx]
            width = int(members.sum(1).max()) if len(idx) else width
            members = members[:, :width]
            members = None if bool(members.all()) else members
        return OutcomeRecord(
            prompt_ids=self.prompt_ids[idx], rewards=self.rewards[idx, :width], correct=self.correct[idx, :width],
            is_replay=self.is_replay[idx], trained=self.trained[idx],
            reward_per_func={k: v[idx, :width] for k, v in self.reward_per_func.items()}, members=members,
        )

    def with_trained(self, trained: bool) -> OutcomeRecord:
        """A copy whose rows are all marked ``trained``."""
        return replace(self, trained=torch.full((self.num_groups,), trained, dtype=torch.bool))

    def fresh(self) -> OutcomeRecord:
        """The groups generated this step (not replayed), trained on or not."""
        return self.select(~self.is_replay)

    def trained_batch(self) -> OutcomeRecord:
        """The groups of the global training batch (fresh and replayed)."""
        return self.select(self.trained)
