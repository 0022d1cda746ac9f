"""Rows that teach nothing: the update leaves the groups whose advantages are all 0 out of its forward and backward
(``optim.skip_zero_advantage``, on by default where exact) and gives the gradient of computing every row, for every
loss type, layout and batching, with replay, ragged groups, LoRA and chunked log-probs; with a KL term or an entropy
bonus it keeps them; a mini-batch with no teaching row runs no pass and the optimizer still steps."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from lit_rlft.core.losses import GRPOLoss
from lit_rlft.core.types import Rollouts
from lit_rlft.models.loading import LoRAConfig
from lit_rlft.step.batching import teaching_rows
from lit_rlft.step.passes import sequence_logprobs
from lit_rlft.step.update import PolicyUpdater, TorchBackend
from tests.step.test_batching import _policy, _rollouts
from tests.step.test_shared_prompt import LOSSES as SHARED_PROMPT_LOSSES

RTOL = 1e-5


def _advantages(roll: Rollouts, zero_groups: list[int], seed: int = 1) -> torch.Tensor:
    """``[N]`` random advantages, exactly 0 in the groups ``zero_groups``."""
    adv = torch.randn(roll.rewards.shape, generator=torch.Generator().manual_seed(seed))  # [B, G]
    adv[zero_groups] = 0.0
    return adv.reshape(-1)


def _run(loss: GRPOLoss, roll: Rollouts, adv: torch.Tensor, skip: bool, ref: bool = False, updates: int = 1,
         policy_kw: dict | None = None, **options) -> dict:
    """Every optimizer step's gradients, the final weights, the rows each forward saw, the backward count and the
    metrics of ``updates`` updates of a fresh policy (SGD with momentum, so every step depends on the ones before)."""
    policy = _policy(0, **(policy_kw or {})).train()
    reference = _policy(1).eval() if ref else None
    updater = PolicyUpdater(loss, 1.0, skip_zero_advantage=skip, max_grad_norm=0.0, **options)
    steps: list[dict[str, torch.Tensor]] = []
    seen: list[int] = []
    backwards: list[int] = []
    policy.register_forward_pre_hook(lambda _m, _a, kw: seen.append(int(kw["input_ids"].shape[0])), with_kwargs=True)

    class Capture(TorchBackend):
        def backward(self, loss_value: torch.Tensor) -> None:
            backwards.append(1)
            super().backward(loss_value)

        def optimizer_step(self) -> None:
            steps.append({n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None})
            super().optimizer_step()

    def ref_logprobs(rollouts, rows):
        with torch.no_grad():
            return sequence_logprobs(reference, rollouts, rows, 1.0, "cpu", packed=updater.padding_free,
                                     trim=updater.micro_batch_tokens is not None)[0]

    backend = Capture(policy, torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.05,
                                              momentum=0.9))
    out = None
    for _ in range(updates):
        out = updater.update(roll, adv, backend, ref_logprobs=ref_logprobs if ref else None)
    return {"steps": steps, "weights": {n: p.detach().clone() for n, p in policy.named_parameters()},
            "seen": seen, "backwards": len(backwards), "metrics": out.metrics, "mu": out.behaviour_logprobs,
            "optimizer_steps": updater.optimizer_steps}


def _assert_same_update(a: dict, b: dict, rtol: float = RTOL) -> None:
    assert len(a["steps"]) == len(b["steps"]) > 0
    for i, (sa, sb) in enumerate(zip(a["steps"], b["steps"])):
        assert sa.keys() == sb.keys() and sa
        for name in sa:
            scale = max(sa[name].abs().max().item(), 1e-12)
            torch.testing.assert_close(sb[name], sa[name], rtol=rtol, atol=rtol * scale, msg=f"step {i}: {name}")
    for name, w in a["weights"].items():
        torch.testing.assert_close(b["weights"][name], w, rtol=rtol, atol=1e-7, msg=name)


#: Every loss type of the shared-prompt tests that the skip applies to (those without a KL term or an entropy bonus),
#: and Dr. GRPO, the entropy quantile and the off-policy mask without them.
LOSSES = {
    **{name: loss for name, loss in SHARED_PROMPT_LOSSES.items() if not loss.zero_advantage_rows_matter},
    "dr_grpo": GRPOLoss(loss_type="dr_grpo", max_completion_length=12),
    "dapo+quantile": GRPOLoss(loss_type="dapo", top_entropy_quantile=0.5),
    "dapo+off_policy_mask": GRPOLoss(loss_type="dapo", off_policy_mask_threshold=0.5),
}


@pytest.mark.parametrize("micro", ["whole", "rows", "tokens"])
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_the_skip_gives_every_rows_update_for_every_loss(name, micro):
    """Two iterations of two mini-batches (pi_old from its own pass, which skips the same rows), replayed groups
    among the fresh ones, groups cut across micro-batches; two of six groups all 0."""
    loss = LOSSES[name]
    roll = _rollouts(B=6, G=3, replay=True)
    adv = _advantages(roll, [1, 4])
    split = {"whole": {}, "rows": {"micro_batch_size": 4}, "tokens": {"micro_batch_tokens": 60}}[micro]
    options = dict(num_iterations=2, num_mini_batches=2, **split)
    every = _run(loss, roll, adv, skip=False, **options)
    skipped = _run(loss, roll, adv, skip=True, **options)
    _assert_same_update(every, skipped)
    assert sum(skipped["seen"]) < sum(every["seen"])  # the zero groups' rows were not passed
    assert skipped["metrics"]["perf/skipped_rows"] == 6 and skipped["metrics"]["perf/skipped_rows_share"] == 6 / 18
    assert skipped["optimizer_steps"] == every["optimizer_steps"] == 4


@pytest.mark.parametrize("layout", ["packed", "shared_prompt", "chunked", "lora", "checkpointing"])
def test_the_skip_gives_every_rows_update_in_every_layout(layout):
    options = {"packed": {"padding_free": True}, "shared_prompt": {"shared_prompt": True},
               "chunked": {"logprob_chunk_tokens": 4}, "lora": {}, "checkpointing": {}}[layout]
    policy_kw = {"lora": {"lora": LoRAConfig(r=4, alpha=8)},
                 "checkpointing": {"gradient_checkpointing": True}}.get(layout, {})
    roll = _rollouts(B=6, G=3, replay=True)
    adv = _advantages(roll, [0, 3, 5])
    for loss in (GRPOLoss(loss_type="dapo"), GRPOLoss(loss_type="bnpo")):
        kw = dict(micro_batch_size=5, num_mini_batches=2, policy_kw=policy_kw, **options)
        every, skipped = _run(loss, roll, adv, False, **kw), _run(loss, roll, adv, True, **kw)
        _assert_same_update(every, skipped)
        assert sum(skipped["seen"]) < sum(every["seen"])


def test_ragged_groups_skip_their_real_rows_only():
    """Groups of 3, 1, 2 and 3 completions (the allocators' batches); the one-member group's advantage is 0."""
    roll = _rollouts(B=4, G=3)
    rows = torch.tensor([[0, 1, 2], [3, -1, -1], [6, 7, -1], [9, 10, 11]])
    ragged = roll.regroup(rows, torch.arange(4))
    adv = _advantages(ragged, [1, 3]) * ragged.member_mask().reshape(-1)
    assert teaching_rows(ragged, adv).tolist() == [True, True, True, False, False, False, True, True, False,
                                                   False, False, False]
    for micro in (None, 2):
        every = _run(GRPOLoss(loss_type="dapo"), ragged, adv, False, micro_batch_size=micro, num_mini_batches=2)
        skipped = _run(GRPOLoss(loss_type="dapo"), ragged, adv, True, micro_batch_size=micro, num_mini_batches=2)
        _assert_same_update(every, skipped)
        assert skipped["metrics"]["perf/skipped_rows"] == 4  # the real rows of groups 1 and 3, not their padding


class _Counting(TorchBackend):
    backwards = 0

    def backward(self, loss: torch.Tensor) -> None:
        self.backwards += 1
        super().backward(loss)


@pytest.mark.parametrize("zero_groups", [[], [0, 1, 2, 3, 4, 5]], ids=["none", "all"])
def test_batches_with_no_or_only_zero_groups(zero_groups):
    """None zero: the same passes; all zero: no pass, no backward, the optimizer and its momentum still step, the
    loss logged as 0 (a second update carries the first one's momentum: the weights still move, as without the
    skip)."""
    roll = _rollouts(B=6, G=3)
    first = _advantages(roll, [])
    adv = _advantages(roll, zero_groups, seed=2)
    runs = {}
    for skip in (False, True):
        policy = _policy(0).train()
        updater = PolicyUpdater(GRPOLoss(loss_type="dapo"), 1.0, skip_zero_advantage=skip, micro_batch_size=4)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3, weight_decay=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
        backend = _Counting(policy, optimizer, scheduler)
        updater.update(roll, first, backend)
        before = backend.backwards
        out = updater.update(roll, adv, backend)
        runs[skip] = (out.metrics, {n: p.detach().clone() for n, p in policy.named_parameters()},
                      backend.backwards - before, scheduler.last_epoch)
    (m_every, w_every, b_every, lr_every), (m_skip, w_skip, b_skip, lr_skip) = runs[False], runs[True]
    for name, w in w_every.items():
        torch.testing.assert_close(w_skip[name], w, rtol=RTOL, atol=1e-7, msg=name)
    assert lr_skip == lr_every == 2  # the scheduler stepped on both updates
    if zero_groups:
        assert b_skip == 0 and b_every == 5  # 18 rows in micro-batches of 4
        assert m_skip["loss"] == 0.0 and m_every["loss"] == 0.0 and m_skip["perf/skipped_rows_share"] == 1.0
        assert m_skip["learning_rate"] == m_every["learning_rate"]
        assert "grad_norm" in m_skip and m_skip["grad_norm"] == m_every["grad_norm"] == 0.0
    else:
        assert b_skip == b_every == 5 and m_skip["perf/skipped_rows"] == 0.0
        assert m_skip["loss"] == pytest.approx(m_every["loss"], rel=1e-5)


@pytest.mark.parametrize("loss", [GRPOLoss(loss_type="dapo", beta=0.04), GRPOLoss(loss_type="grpo", entropy_coef=0.05),
                                  GRPOLoss(loss_type="dapo", use_adaptive_entropy=True)],
                         ids=["kl", "entropy_bonus", "adaptive_entropy"])
def test_a_kl_term_or_an_entropy_bonus_keeps_every_row(loss):
    """Such a row has a gradient (the KL pulls it to the reference, the bonus raises its entropy): nothing skipped,
    the passes and the update bit for bit those of skip_zero_advantage=false."""
    roll = _rollouts(B=6, G=3)
    adv = _advantages(roll, [0, 1, 2])
    updater = PolicyUpdater(loss, 1.0)
    assert not updater.skips_zero_advantage and loss.zero_advantage_rows_matter
    every = _run(loss, roll, adv, skip=False, ref=loss.beta > 0, micro_batch_size=4)
    kept = _run(loss, roll, adv, skip=True, ref=loss.beta > 0, micro_batch_size=4)
    assert kept["seen"] == every["seen"] and "perf/skipped_rows" not in kept["metrics"]
    for name, w in every["weights"].items():
        assert torch.equal(kept["weights"][name], w), name


def test_skipped_fresh_rows_carry_the_engines_mu_or_none_and_the_rest_their_pass():
    """The replay buffer stores mu: fresh rows the update passed get pi_old from the pass (as without the skip),
    skipped ones the engine's log-probs where the engine gave them and NaN otherwise; replayed rows keep theirs."""
    roll = _rollouts(B=6, G=3, replay=True)  # groups 1, 3 and 5 replayed
    adv = _advantages(roll, [0, 1])
    every = _run(GRPOLoss(loss_type="dapo"), roll, adv, skip=False)
    skipped = _run(GRPOLoss(loss_type="dapo"), roll, adv, skip=True)
    rows = torch.arange(18).reshape(6, 3)
    mask = roll.completion_mask.bool()
    for b in range(6):
        for r in rows[b].tolist():
            m = mask[r]
            if b == 0:  # fresh and skipped: no pass gave it pi_old
                assert torch.isnan(skipped["mu"][r][m]).all()
            else:  # passed, or replayed (its stored mu)
                torch.testing.assert_close(skipped["mu"][r][m], every["mu"][r][m], rtol=1e-5, atol=1e-6)
    engine = -torch.rand(roll.completion_tokens.shape, generator=torch.Generator().manual_seed(3))
    with_engine = dataclasses.replace(roll, engine_logprobs=engine)
    out = _run(GRPOLoss(loss_type="dapo"), with_engine, adv, skip=True)
    torch.testing.assert_close(out["mu"][0][mask[0]], engine[0][mask[0]])


def test_the_replay_buffer_leaves_out_groups_without_behaviour_log_probs():
    from lit_rlft.callbacks import ReplayCallback

    roll = _rollouts(B=2, G=3)
    roll.rewards = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    roll.correct = roll.rewards >= 1
    mu = -torch.rand(roll.completion_tokens.shape)
    mu[0:3] = math.nan  # group 0: skipped by the update, no pi_old
    stored = ReplayCallback._fresh_groups(dataclasses.replace(roll, behaviour_logprobs=mu))
    assert [g.prompt_id for g in stored] == [1]
