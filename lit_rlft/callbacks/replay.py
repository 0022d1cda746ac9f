"""ReplayCallback: rollout replay (fresh rollouts for delta*B prompts, the rest replayed from a FIFO buffer)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from lit_rlft.callbacks.base import RolloutHook, StepCallback
from lit_rlft.core.types import OutcomeRecord, Rollouts, pad_to
from lit_rlft.selection.replay import ReplayBuffer, StoredGroup, validate_replay_config
from lit_rlft.step.context import StepContext, StepOutput


class ReplayCallback(RolloutHook, StepCallback):
    """Generate only ``ceil(delta * B)`` groups per step and replay the rest from recent effective groups.

    The datamodule's plan is shrunk to the fresh share, so a selection callback (DPS, DOTS, ...) chooses which
    prompts get fresh rollouts; without one they are uniform. Replayed groups are drawn uniformly from a FIFO
    buffer of whole effective groups (0 < success rate < 1, newest group per prompt, ``capacity`` groups); their
    advantages are recomputed from the stored rewards and their loss is importance-corrected with the stored
    behaviour log-probs (``model.loss.off_policy``). When the buffer holds too few groups (early steps),
    the batch is filled with extra fresh prompts (``fill="fresh"``, the default) or left short
    (``fill="none"``, as the reference code does). Logs ``replay/{fresh_groups, replayed_groups, filled_groups,
    overlap, mean_age, buffer_size}``; the buffer is part of the checkpoint.

    On ``W`` ranks the buffer is global and the same on every rank: each step adds every rank's fresh effective
    groups (gathered), draws the replayed groups once (the same draw everywhere) and hands rank ``r`` the ``r``-th
    slice. Every count (fresh, replayed, filled) is rounded down to a multiple of ``W`` so that every rank trains
    on the same number of groups; ``ceil(delta * B)`` and ``B`` must divide by ``W``.

    Example::

        trainer = L.Trainer(callbacks=[DPSCallback(), ReplayCallback(delta=0.5, capacity=256)])

    Args:
        delta: fraction of the batch generated fresh each step, in (0, 1].
        capacity: groups the buffer keeps (at least the replayed share ``B - ceil(delta * B)``).
        fill: ``fresh`` tops a short batch up with fresh prompts; ``none`` trains on a smaller batch.
        seed: seed of the buffer's sampling.
    """

    def __init__(self, delta: float = 0.5, capacity: int = 256, fill: Literal["fresh", "none"] = "fresh",
                 seed: int = 0):
        if fill not in ("fresh", "none"):
            raise ValueError(f"ReplayCallback: fill must be 'fresh' or 'none', got {fill!r}")
        validate_replay_config(delta, capacity, 1)  # checks delta now; capacity once B is known
        self.delta, self.capacity, self.fill, self.seed = delta, capacity, fill, seed
        self.buffer = ReplayBuffer(capacity, seed=seed)
        self.num_fresh = self.num_replay = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(delta=self.delta, capacity=self.capacity)

    def setup_step(self, ctx: StepContext) -> None:
        plan = ctx.data.plan
        batch_size = ctx.data.batch_size
        self.num_fresh, self.num_replay = validate_replay_config(self.delta, self.capacity, batch_size)
        world = ctx.collective.world_size
        if self.num_fresh % world:
            raise ValueError(
                f"ReplayCallback: delta={self.delta} gives {self.num_fresh} fresh prompts of data.batch_size="
                f"{batch_size}, which does not divide by the {world} ranks: pick delta so that ceil(delta * "
                f"batch_size) is a multiple of {world}"
            )
        plan.batch_size = self.num_fresh

    # -- step 4: mix replayed groups into the fresh ones ------------------------------------------------------
    def on_rollouts(self, ctx: StepContext, rollouts: Rollouts,
                    record: OutcomeRecord) -> tuple[Rollouts, OutcomeRecord]:
        coll = ctx.collective
        world, rank = coll.world_size, coll.rank
        fresh_ids = set(record.prompt_ids.tolist())  # every rank's fresh prompts
        overlap = sum(1 for i in fresh_ids if i in self.buffer)
        groups = self.buffer.sample(self.num_replay, exclude_prompt_ids=fresh_ids)  # the same draw on every rank
        groups = groups[: len(groups) // world * world]
        per_rank = len(groups) // world
        parts, records = [rollouts], [record]
        if groups:
            parts.append(self._to_rollouts(groups[rank * per_rank : (rank + 1) * per_rank], ctx, rollouts.pad_id))
            records.append(_record_of(groups))
        short = self.num_replay - len(groups)
        filled = 0
        if short > 0 and self.fill == "fresh":
            used = fresh_ids | {g.prompt_id for g in groups}
            ids = ctx.data.plan.draw_unused(short, used)
            ids = ids[: len(ids) // world * world]
            if ids.size:
                local, filled_record = ctx.rollout(ids, purpose="train")
                parts.append(local)
                records.append(filled_record)
                filled = int(ids.size)
        step = ctx.rollout_step
        ages = [step - g.step for g in groups]
        ctx.log({
            "replay/fresh_groups": float(record.num_groups + filled),
            "replay/replayed_groups": float(len(groups)),
            "replay/filled_groups": float(filled),
            "replay/overlap": float(overlap),
            "replay/mean_age": float(np.mean(ages)) if ages else 0.0,
            "replay/buffer_size": float(len(self.buffer)),
        })
        return Rollouts.concat(parts), OutcomeRecord.concat(records)

    def _to_rollouts(self, groups: list[StoredGroup], ctx: StepContext, pad_id: int) -> Rollouts:
        if len({g.num_generations for g in groups}) > 1:  # groups of different sizes: padded to the widest
            return Rollouts.concat([self._to_rollouts([g], ctx, pad_id) for g in groups])
        G = groups[0].num_generations
        p_len = max(g.prompt_tokens.numel() for g in groups)
        c_len = max(int(c.numel()) for g in groups for c in g.completion_tokens)
        prompts = torch.stack([pad_to(g.prompt_tokens, p_len, pad_id, left=True) for g in groups])
        p_mask = torch.stack([pad_to(torch.ones_like(g.prompt_tokens), p_len, 0, left=True) for g in groups])
        comps = [c for g in groups for c in g.completion_tokens]
        stop = set(ctx.stop_token_ids)
        return Rollouts(
            prompt_ids=torch.tensor([g.prompt_id for g in groups], dtype=torch.long),
            prompt_tokens=prompts.repeat_interleave(G, dim=0),
            prompt_mask=p_mask.repeat_interleave(G, dim=0),
            completion_tokens=torch.stack([pad_to(c, c_len, pad_id) for c in comps]),
            completion_mask=torch.stack([pad_to(torch.ones_like(c), c_len, 0) for c in comps]),
            rewards=torch.stack([g.rewards for g in groups]),
            correct=torch.stack([g.correct for g in groups]),
            birth_step=torch.tensor([g.step for g in groups], dtype=torch.long),
            is_replay=torch.ones(len(groups), dtype=torch.bool),
            truncated=torch.tensor([c.numel() == 0 or int(c[-1]) not in stop for c in comps]),
            behaviour_logprobs=torch.stack([pad_to(lp.float(), c_len, 0.0) for g in groups
                                            for lp in g.behaviour_logprobs]),
            completions=ctx.tokenizer.batch_decode([c.tolist() for c in comps], skip_special_tokens=True),
            prompts=ctx.tokenizer.batch_decode([g.prompt_tokens.tolist() for g in groups],
                                                     skip_special_tokens=True),
            pad_id=pad_id,
            policy_mask=None if all(g.policy_masks is None for g in groups) else torch.stack(
                [pad_to(m, c_len, 0) for g in groups
                 for m in (g.policy_masks or [torch.ones_like(c) for c in g.completion_tokens])]),
        )

    # -- step 7: store this step's fresh effective groups ---------------------------------------------------
    def after_step(self, ctx: StepContext, output: StepOutput) -> None:
        groups = self._fresh_groups(output.rollouts)
        coll = ctx.collective
        if coll.is_distributed:  # every rank's groups, in rank order: the same buffer everywhere
            groups = [g for part in coll.all_gather(groups) for g in part]
        self.buffer.add_many(groups)

    @staticmethod
    def _fresh_groups(rollouts: Rollouts) -> list[StoredGroup]:
        G = rollouts.group_size
        mu = rollouts.behaviour_logprobs  # [N, L], completed by the step's update (the rule: Rollouts)
        if mu is None:
            raise RuntimeError("ReplayCallback: the trained rollouts carry no behaviour_logprobs (the policy update "
                               "writes them): store groups after the step's update, from StepOutput.rollouts")
        out = []
        for b in torch.nonzero(~rollouts.is_replay).flatten().tolist():
            rate = float(rollouts.success_rates[b])
            if not 0 < rate < 1:
                continue
            size = int(rollouts.group_sizes[b])  # its real completions (a prefix of the group's rows)
            rows = range(b * G, b * G + size)
            lengths = [int(rollouts.completion_mask[r].sum()) for r in rows]
            if not all(bool(torch.isfinite(mu[r, :n]).all()) for r, n in zip(rows, lengths)):
                continue  # a group the update left out (all its advantages 0): no pass computed its mu
            out.append(StoredGroup(
                prompt_id=int(rollouts.prompt_ids[b]),
                prompt_tokens=rollouts.prompt_tokens[b * G][rollouts.prompt_mask[b * G].bool()].clone(),
                completion_tokens=[rollouts.completion_tokens[r, :n].clone() for r, n in zip(rows, lengths)],
                behaviour_logprobs=[mu[r, :n].clone() for r, n in zip(rows, lengths)],
                rewards=rollouts.rewards[b, :size].clone(),
                correct=rollouts.correct[b, :size].clone(),
                step=int(rollouts.birth_step[b]),
                policy_masks=None if rollouts.policy_mask is None
                else [rollouts.policy_mask[r, :n].clone() for r, n in zip(rows, lengths)],
            ))
        return out

    # -- checkpointing ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "buffer": self.buffer.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "buffer" in state_dict:
            self.buffer.load_state_dict(state_dict["buffer"])


def _record_of(groups: list[StoredGroup]) -> OutcomeRecord:
    """The outcome record of replayed groups (trained on, marked replayed)."""
    if len({g.num_generations for g in groups}) > 1:  # groups of different sizes: padded to the widest
        return OutcomeRecord.concat([_record_of([g]) for g in groups])
    return OutcomeRecord(
        prompt_ids=torch.tensor([g.prompt_id for g in groups], dtype=torch.long),
        rewards=torch.stack([g.rewards for g in groups]).float(),
        correct=torch.stack([g.correct for g in groups]),
        is_replay=torch.ones(len(groups), dtype=torch.bool),
        trained=torch.ones(len(groups), dtype=torch.bool),
    )
