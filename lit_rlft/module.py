"""GRPOModule: GRPO with the off-policy (replay) loss as a LightningModule, with manual optimisation.

One training step (rollout step), as named calls::

    prompt_ids = self.data.plan.next_batch()        # 1. what the plan says (callbacks wrote it last step)
    rollouts = self.generate_rollouts(prompt_ids)   # 2. generate G completions per prompt, 3. score them
    rollouts = self.apply_rollout_hooks(rollouts)   # 4. callbacks reshape (dynamic sampling, replay)
    advantages = group_advantages(...)              # 5. group-relative advantages
    self.optimize(rollouts, advantages)             # 6. num_iterations x num_mini_batches optimizer steps
    # 7. on_train_batch_end: callbacks observe outcomes and plan the next step

Notation: ``B`` prompts, ``G = num_generations``, ``N = B * G``, ``P`` prompt length, ``L`` completion length.

``trainer.max_steps`` counts optimizer steps (Lightning's and TRL's convention): one rollout step makes
``num_iterations * num_mini_batches`` of them. TensorBoard's x axis is the rollout step.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from torch import Tensor

from lit_rlft.budget import RolloutBudget
from lit_rlft.callbacks.base import RolloutHook
from lit_rlft.core.advantages import ScaleRewards, group_advantages
from lit_rlft.core.logprobs import completion_logprobs
from lit_rlft.core.losses import GRPOLoss, LossType, OffPolicyForm
from lit_rlft.core.types import Rollouts, left_pad
from lit_rlft.models.loading import LoRAConfig, apply_lora, load_policy
from lit_rlft.models.tiny import TinyConfig
from lit_rlft.optim import adamw_with_warmup
from lit_rlft.rewards.runner import RewardRunner, resolve_reward
from lit_rlft.rollout.base import RolloutEngine, SamplingConfig
from lit_rlft.rollout.hf import HFEngine
from lit_rlft.selection.base import effective_ratio
from lit_rlft.selection.dynamic import keep_mask

RewardFunc = Callable[..., Sequence[float | None]]


class GRPOModule(L.LightningModule):
    """Group Relative Policy Optimisation with rollout-replay support.

    Args:
        model: HF causal-LM directory or hub name, or ``"tiny"`` (a freshly initialised tiny Qwen2).
        tiny: size of the tiny model when ``model="tiny"``.
        dtype: ``float32`` | ``bfloat16`` | ``float16`` weights.
        lora: LoRA adapters (peft); ``None`` trains all parameters.
        reward_funcs: reward callables or dotted paths (``lit_rlft.rewards.countdown_reward``).
        reward_weights: one weight per reward function (default 1 each).
        reward_timeout_s: a reward call running longer scores 0 and is counted (``rewards/timeouts``).
        success_threshold: a completion is correct when its total reward is at least this.
        num_generations: completions per prompt (``G``).
        temperature: sampling temperature (also used for training log-probs, as TRL does).
        top_p: nucleus sampling.
        top_k: top-k sampling (0 = off).
        max_completion_length: new tokens per completion at most.
        generation_batch_size: sequences per ``generate`` call (``None`` = the whole batch).
        scale_rewards: ``group`` (GRPO), ``batch`` or ``none`` (Dr. GRPO) advantage normalisation.
        loss_type: ``grpo`` (sequence mean), ``dapo`` (token mean) or ``dr_grpo`` (sum / max length).
        epsilon: lower clip range.
        epsilon_high: upper clip range (``None`` = ``epsilon``; DAPO's clip-higher uses 0.28).
        beta: KL coefficient (k3 estimator) against the reference policy; 0 loads no reference model.
        off_policy: replayed samples' loss: ``geppo`` (reference code) or ``paper`` (ratio to the behaviour policy).
        importance_cap: cap on pi_old / mu for replayed samples (``geppo``).
        num_iterations: passes over each rollout batch (TRL's ``num_iterations``, PPO epochs).
        num_mini_batches: optimizer steps per pass; the batch's sequences are shuffled and split.
        micro_batch_size: sequences per forward/backward (gradient accumulation inside a mini-batch).
        learning_rate: AdamW learning rate.
        adam_betas: AdamW betas.
        weight_decay: AdamW weight decay.
        warmup_steps: linear warm-up in optimizer steps.
        lr_scheduler: ``constant`` or ``cosine`` after warm-up (cosine decays over ``trainer.max_steps``).
        max_grad_norm: gradient clipping by global norm (0 = off).
        eval_num_generations: samples per validation prompt (mean@k accuracy and pass@k).
        eval_temperature: validation temperature (``None`` = the training temperature).
        generation_seed: re-seed torch's generator at the start of every rollout step with
            ``(generation_seed, step)``, so a resumed run samples what the uninterrupted run sampled
            (``None``: never re-seed).
    """

    def __init__(
        self,
        model: str = "tiny",
        tiny: TinyConfig | None = None,
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        lora: LoRAConfig | None = None,
        reward_funcs: list[RewardFunc] | None = None,
        reward_weights: list[float] | None = None,
        reward_timeout_s: float = 10.0,
        success_threshold: float = 1.0,
        num_generations: int = 8,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_completion_length: int = 256,
        generation_batch_size: int | None = None,
        scale_rewards: ScaleRewards = "group",
        loss_type: LossType = "dapo",
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        off_policy: OffPolicyForm = "geppo",
        importance_cap: float | None = 10.0,
        num_iterations: int = 1,
        num_mini_batches: int = 1,
        micro_batch_size: int | None = None,
        learning_rate: float = 1e-6,
        adam_betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        lr_scheduler: Literal["constant", "cosine"] = "constant",
        max_grad_norm: float = 1.0,
        eval_num_generations: int = 1,
        eval_temperature: float | None = None,
        generation_seed: int | None = 0,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["reward_funcs", "tiny", "lora"])
        # Plain types only: Lightning loads checkpoints with weights_only=True, which refuses dataclasses.
        self.hparams["tiny"] = _plain(tiny)
        self.hparams["lora"] = _plain(lora)
        self.automatic_optimization = False
        _check_positive(num_generations=num_generations, num_iterations=num_iterations,
                        num_mini_batches=num_mini_batches, eval_num_generations=eval_num_generations)
        if num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 for group-relative advantages, got {num_generations}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or null, got {micro_batch_size}")
        if reward_weights is not None and reward_funcs is not None and len(reward_weights) != len(reward_funcs):
            raise ValueError(
                f"reward_weights has {len(reward_weights)} entries but reward_funcs has {len(reward_funcs)}"
            )
        if max_completion_length < 1:
            raise ValueError(f"max_completion_length must be >= 1, got {max_completion_length}")
        for name, t in (("temperature", temperature), ("eval_temperature", eval_temperature)):
            if t is not None and t <= 0:
                raise ValueError(f"{name} must be > 0 (sampling, not greedy decoding), got {t}")
        if scale_rewards not in ("group", "batch", "none"):
            raise ValueError(f"scale_rewards must be one of group, batch, none; got {scale_rewards!r}")
        if lr_scheduler not in ("constant", "cosine"):
            raise ValueError(f"lr_scheduler must be constant or cosine, got {lr_scheduler!r}")
        self.model_name = model
        self.G = num_generations
        self.sampling = SamplingConfig(temperature, top_p, top_k, max_completion_length)
        self.eval_sampling = SamplingConfig(temperature if eval_temperature is None else eval_temperature, top_p,
                                            top_k, max_completion_length)
        self.loss_fn = GRPOLoss(
            epsilon=epsilon, epsilon_high=epsilon_high, loss_type=loss_type, beta=beta,
            max_completion_length=max_completion_length, off_policy=off_policy, importance_cap=importance_cap,
        )
        funcs = [resolve_reward(f) for f in (reward_funcs or [])]
        if not funcs:
            raise ValueError("reward_funcs is empty: give at least one, e.g. lit_rlft.rewards.countdown_reward")
        self.rewards = RewardRunner(funcs, weights=reward_weights, timeout_s=reward_timeout_s)
        self.policy: torch.nn.Module | None = None
        self.ref_model: torch.nn.Module | None = None
        self.engine: RolloutEngine | None = None
        self.tokenizer: Any = None
        self.budget = RolloutBudget()
        self.rollout_step = 0  # completed rollout steps (checkpointed)
        self._eval: dict[str, list[float]] = defaultdict(list)
        # Objects are kept as given: under LightningCLI, ``self.hparams`` holds the raw config (dicts).
        self.lora = lora
        self._load_tokenizer_and_policy(tiny)

    # ------------------------------------------------------------------------------------------------ set-up
    def _load_tokenizer_and_policy(self, tiny: TinyConfig | None) -> None:
        hp = self.hparams
        policy, self.tokenizer = load_policy(hp.model, dtype=hp.dtype, tiny=tiny)
        if self.lora is not None:
            policy = apply_lora(policy, self.lora)
        elif hp.beta > 0:
            self.ref_model = copy.deepcopy(policy).eval().requires_grad_(False)
        self.policy = policy
        self.engine = HFEngine(policy, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id,
                               max_batch_size=hp.generation_batch_size)

    @property
    def data(self) -> Any:
        """The prompt source (``trainer.datamodule``): plan, pools, tokenised prompts, reward columns."""
        return self.trainer.datamodule

    def setup(self, stage: str) -> None:
        if self.trainer.datamodule is None:
            raise RuntimeError("GRPOModule needs a PromptDataModule (trainer.fit(module, datamodule=...))")
        self.data.set_tokenizer(self.tokenizer)

    def on_fit_start(self) -> None:
        # A validation run before fit (e.g. the demo's "before" evaluation) leaves modules in eval mode.
        self.policy.train()

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        total = self.trainer.max_steps if self.trainer.max_steps and self.trainer.max_steps > 0 else None
        return adamw_with_warmup(self.policy.parameters(), hp.learning_rate, hp.adam_betas, hp.weight_decay,
                                 hp.warmup_steps, hp.lr_scheduler, total)

    # ------------------------------------------------------------------------------------------ rollouts
    def generate_rollouts(
        self,
        prompt_ids: np.ndarray,
        purpose: str = "train",
        split: Literal["train", "val"] = "train",
        sampling: SamplingConfig | None = None,
        num_generations: int | None = None,
    ) -> Rollouts:
        """Generate ``G`` completions for each prompt id ``[B]`` and score them (steps 2-3).

        Every call is charged to the budget under ``purpose`` unless ``purpose == "eval"``.
        """
        G = num_generations or self.G
        ids = np.asarray(prompt_ids, dtype=np.int64)
        prompts = self.data.prompt_tokens(ids, split)
        t0 = time.perf_counter()
        out = self.engine.generate(prompts, G, sampling or self.sampling)
        seconds = time.perf_counter() - t0
        if purpose != "eval":
            self.budget.add(len(ids), len(ids) * G, out.num_tokens, seconds, purpose)
        self._last_generation_s = seconds
        texts = self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
        cols = self.data.reward_columns(ids, split)
        cols = {k: [v for v in vals for _ in range(G)] for k, vals in cols.items()}
        scored = self.rewards(texts, cols)
        rewards = scored.total.view(len(ids), G)
        self._last_reward_result = scored
        p_tok, p_mask = left_pad(prompts, self.tokenizer.pad_token_id)  # [B, P] each
        return Rollouts(
            prompt_ids=torch.as_tensor(ids),
            prompt_tokens=p_tok.repeat_interleave(G, dim=0),
            prompt_mask=p_mask.repeat_interleave(G, dim=0),
            completion_tokens=out.completion_ids,
            completion_mask=out.completion_mask,
            rewards=rewards,
            correct=rewards >= self.hparams.success_threshold,
            birth_step=torch.full((len(ids),), self.rollout_step, dtype=torch.long),
            is_replay=torch.zeros(len(ids), dtype=torch.bool),
            truncated=torch.tensor([r == "length" for r in out.finish_reasons]),
            completions=texts,
            prompts=self.data.prompt_texts(ids, split),
            pad_id=self.tokenizer.pad_token_id,
        )

    def success_rates(self, prompt_ids: np.ndarray, purpose: str = "reference") -> np.ndarray:
        """Roll out ``prompt_ids`` ``[K]`` under the current policy and return their success rates ``[K]``.

        Used by strategies that label prompts outside the training batch (DOTS' reference set); charged to the
        budget under ``purpose``. Sampling is re-seeded from ``(generation_seed, step)`` so a resumed run labels
        prompts exactly as the uninterrupted run did.
        """
        self._reseed(salt=1)
        return self.generate_rollouts(prompt_ids, purpose=purpose).success_rates.numpy()

    def _reseed(self, salt: int) -> None:
        """Seed torch's generator from ``(generation_seed, rollout_step, salt)`` (no-op without a seed)."""
        if self.hparams.generation_seed is not None:
            torch.manual_seed(self.hparams.generation_seed * 1_000_003 + self.rollout_step + salt * 1_000_000_007)

    def apply_rollout_hooks(self, rollouts: Rollouts) -> Rollouts:
        """Step 4: let :class:`RolloutHook` callbacks reshape the batch, in ``trainer.callbacks`` order."""
        for cb in self.trainer.callbacks:
            if isinstance(cb, RolloutHook):
                rollouts = cb.on_rollouts(self.trainer, self, rollouts)
        return rollouts

    # ------------------------------------------------------------------------------------------ log-probs
    def sequence_logprobs(
        self, model: torch.nn.Module, rollouts: Rollouts, rows: Tensor, with_entropy: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Per-token log-probs ``[n, L]`` (and entropy) of the completions at ``rows`` ``[n]`` under ``model``."""
        prompt, comp = rollouts.prompt_tokens[rows], rollouts.completion_tokens[rows]
        attn = torch.cat([rollouts.prompt_mask[rows], rollouts.completion_mask[rows]], dim=1).to(self.device)
        input_ids = torch.cat([prompt, comp], dim=1).to(self.device)  # [n, P+L]
        position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)  # as generate computes them under left padding
        L_ = comp.shape[1]
        logits = model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids,
                       logits_to_keep=L_ + 1).logits[:, :-1]  # [n, L, V]
        logprobs, entropy = completion_logprobs(logits, comp.to(self.device), self.sampling.temperature)
        return logprobs, (entropy if with_entropy else None)

    @torch.no_grad()
    def _reference_logprobs(self, rollouts: Rollouts, rows: Tensor) -> Tensor | None:
        if self.hparams.beta == 0:
            return None
        if self.lora is not None:
            with self.policy.disable_adapter():
                return self.sequence_logprobs(self.policy, rollouts, rows)[0]
        return self.sequence_logprobs(self.ref_model, rollouts, rows)[0]

    # ------------------------------------------------------------------------------------------ training
    def training_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        t_step = time.perf_counter()
        self._reseed(salt=0)
        prompt_ids = self.data.plan.next_batch()  # 1
        rollouts = self.generate_rollouts(prompt_ids)  # 2-3
        generation_s = self._last_generation_s
        fresh_reward_result = self._last_reward_result
        rollouts = self.apply_rollout_hooks(rollouts)  # 4
        advantages = group_advantages(rollouts.rewards, self.hparams.scale_rewards)  # 5, [B, G]
        loss_metrics = self.optimize(rollouts, advantages.reshape(-1))  # 6
        self.rollout_step += 1
        metrics = {**self.rollout_metrics(rollouts), **loss_metrics, **self.budget.metrics()}
        metrics.update({f"rewards/{k}/mean": float(v.mean()) for k, v in fresh_reward_result.per_func.items()})
        metrics.update({f"rewards/{k}": float(v) for k, v in self.rewards.totals.items()})
        metrics["time/generation_s"] = generation_s
        metrics["time/step_s"] = time.perf_counter() - t_step
        metrics["time/generation_share"] = generation_s / max(metrics["time/step_s"], 1e-9)
        reward = metrics.pop("reward")
        self.log("reward", reward, prog_bar=True, on_step=True, on_epoch=False, batch_size=rollouts.num_groups)
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=rollouts.num_groups)
        return {"rollouts": rollouts, "plan_source": self.data.plan.last_source}

    def optimize(self, rollouts: Rollouts, advantages: Tensor) -> dict[str, float]:
        """Step 6: ``num_iterations`` passes of ``num_mini_batches`` optimizer steps over the ``N`` sequences.

        ``advantages`` is ``[N]``. pi_old is the policy that generated the fresh rows: when the batch is used for
        one optimizer step only, it equals the current policy, so its log-probs come from the same forward pass.
        """
        hp = self.hparams
        opt = self.optimizers()
        sched = self.lr_schedulers()
        N = rollouts.completion_tokens.shape[0]
        single_update = hp.num_iterations == 1 and hp.num_mini_batches == 1
        old = None if single_update else self._old_logprobs(rollouts)
        stats: dict[str, list[float]] = defaultdict(list)
        for _ in range(hp.num_iterations):
            perm = torch.randperm(N) if hp.num_mini_batches > 1 else torch.arange(N)
            for mb in perm.chunk(hp.num_mini_batches):
                opt.zero_grad(set_to_none=True)
                weight_total = self._loss_weight(rollouts, mb)
                micro = hp.micro_batch_size or len(mb)
                for rows in mb.split(micro):
                    out, entropy = self._loss(rollouts, rows, advantages, old)
                    self.manual_backward(out.loss * (self._loss_weight(rollouts, rows) / weight_total))
                    for k, v in out.metrics.items():
                        stats[k].append(float(v))
                    stats["entropy"].append(float(entropy))
                    stats["loss"].append(float(out.loss.detach()))
                if hp.max_grad_norm > 0:
                    params = [p for p in self.policy.parameters() if p.requires_grad]
                    stats["grad_norm"].append(float(torch.nn.utils.clip_grad_norm_(params, hp.max_grad_norm)))
                opt.step()
                sched.step()
        reduce = {"/min": np.min, "/max": np.max}
        out = {k: float(reduce.get(k[k.rfind("/"):], np.mean)(v)) for k, v in stats.items()}
        out["learning_rate"] = float(sched.get_last_lr()[0])
        return out

    def _loss_weight(self, rollouts: Rollouts, rows: Tensor) -> float:
        """Share of a micro-batch in its mini-batch's loss: tokens for ``dapo``, sequences otherwise."""
        if self.hparams.loss_type == "dapo":
            return float(rollouts.completion_mask[rows].sum().clamp(min=1))
        return float(len(rows))

    @torch.no_grad()
    def _old_logprobs(self, rollouts: Rollouts) -> Tensor:
        N = rollouts.completion_tokens.shape[0]
        micro = self.hparams.micro_batch_size or N
        parts = [self.sequence_logprobs(self.policy, rollouts, rows)[0] for rows in torch.arange(N).split(micro)]
        return torch.cat(parts)

    def _loss(self, rollouts: Rollouts, rows: Tensor, advantages: Tensor, old: Tensor | None) -> tuple[Any, Tensor]:
        logprobs, entropy = self.sequence_logprobs(self.policy, rollouts, rows, with_entropy=True)  # [n, L]
        mask = rollouts.completion_mask[rows].to(self.device)
        old_rows = logprobs.detach() if old is None else old[rows].to(self.device)
        behaviour = None
        if bool(rollouts.is_replay.any()):
            if rollouts.behaviour_logprobs is None:
                raise RuntimeError("replayed groups need behaviour_logprobs (set by the replay callback)")
            replay_rows = rollouts.is_replay.repeat_interleave(rollouts.group_size)[rows].to(self.device)
            stored = rollouts.behaviour_logprobs[rows].to(self.device)
            behaviour = torch.where(replay_rows[:, None], stored, old_rows)
        if rollouts.old_logprobs is None:
            rollouts.old_logprobs = torch.zeros(rollouts.completion_tokens.shape, dtype=torch.float32)
        rollouts.old_logprobs[rows] = old_rows.detach().float().cpu()
        out = self.loss_fn(
            logprobs, old_rows, advantages[rows].to(self.device), mask,
            ref_logprobs=self._reference_logprobs(rollouts, rows), behaviour_logprobs=behaviour,
        )
        ent = (entropy.detach() * mask).sum() / mask.sum().clamp(min=1)
        return out, ent

    # ------------------------------------------------------------------------------------------ metrics
    def rollout_metrics(self, rollouts: Rollouts) -> dict[str, float]:
        """TRL-named statistics of the batch actually trained on."""
        r = rollouts.rewards
        std = r.std(dim=1)
        lengths = rollouts.completion_mask.sum(dim=1).float()
        return {
            "reward": float(r.mean()),
            "reward_std": float(std.mean()),
            "accuracy": float(rollouts.correct.float().mean()),
            # max == min rather than std == 0: the float std of equal rewards such as 0.1 need not be exactly 0
            "frac_reward_zero_std": float(1.0 - keep_mask(r.numpy()).mean()),
            "effective_ratio": effective_ratio(rollouts.success_rates.numpy()),
            "completions/mean_length": float(lengths.mean()),
            "completions/min_length": float(lengths.min()),
            "completions/max_length": float(lengths.max()),
            "completions/clipped_ratio": float(rollouts.truncated.float().mean()),
            "batch/groups": float(rollouts.num_groups),
            "batch/replayed_groups": float(rollouts.is_replay.sum()),
        }

    # ------------------------------------------------------------------------------------------ validation
    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        """Accuracy sampled at the eval temperature on validation prompt ids ``batch`` ``[b]``."""
        ids = batch.cpu().numpy()
        k = self.hparams.eval_num_generations
        roll = self.generate_rollouts(ids, purpose="eval", split="val", sampling=self.eval_sampling, num_generations=k)
        acc = roll.correct.float().mean(dim=1).tolist()  # [b] mean@k
        passk = roll.correct.any(dim=1).float().tolist()
        self._eval["accuracy"].extend(acc)
        self._eval[f"pass@{k}"].extend(passk)
        self._eval["reward"].extend(roll.rewards.mean(dim=1).tolist())
        difficulty = self.data.reward_columns(ids, "val").get("difficulty")
        if difficulty is not None:
            for d, a in zip(difficulty, acc):
                self._eval[f"accuracy/difficulty_{d}"].append(a)

    def on_validation_epoch_end(self) -> None:
        metrics = {f"val/{k}": float(np.mean(v)) for k, v in self._eval.items() if v}
        metrics.update({f"val/n/{k}": float(len(v)) for k, v in self._eval.items() if k.startswith("accuracy")})
        self._eval.clear()
        if metrics:
            self.log_dict(metrics, on_step=False, on_epoch=True)
        self.last_eval = metrics

    # ------------------------------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lit_rlft"] = {
            "rollout_step": self.rollout_step,
            "budget": self.budget.state_dict(),
            "reward_totals": dict(self.rewards.totals),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("lit_rlft", {})
        self.rollout_step = state.get("rollout_step", 0)
        self.budget.load_state_dict(state.get("budget", {}))
        self.rewards.totals.update(state.get("reward_totals", {}))

    def save_pretrained(self, path: str) -> None:
        """Write the policy (merged LoRA adapters included) and tokenizer as an HF checkpoint directory."""
        model = self.policy
        if self.lora is not None:
            model = copy.deepcopy(model).merge_and_unload()
        model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)


def _check_positive(**values: int) -> None:
    for name, v in values.items():
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")


def _plain(obj: Any) -> Any:
    """A dataclass (or a dict from the CLI) as a plain dict, for hyper-parameters."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj
