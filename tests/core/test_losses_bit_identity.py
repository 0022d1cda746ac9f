"""Today's GRPOLoss, with the options that existed before issue 18 and the new options at their defaults, is
bit-identical (``torch.equal``: loss, gradient, every metric, metric order) to the frozen copy in
``frozen_losses.py``. Seven fingerprinted training runs depend on it; a tolerance would hide a reordered sum."""

import itertools

import pytest
import torch

from lit_rlft.core.losses import GRPOLoss
from tests.core.frozen_losses import GRPOLoss as FrozenGRPOLoss


def _batch(seed: int, n: int = 6, length: int = 7, garbage: bool = False):
    """Random rows of several lengths (one empty), both advantage signs, ratios inside and outside the clip."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, length, generator=g) * 3  # [N, L]
    logp = old + torch.randn(n, length, generator=g) * 0.4
    mu = old + torch.randn(n, length, generator=g) * 0.6
    ref = old + torch.randn(n, length, generator=g) * 0.3
    adv = torch.randn(n, generator=g)
    lengths = torch.tensor([length, 1, 4, 0, length - 2, 3])[:n]
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()  # [N, L]
    if garbage:  # NaN / inf behind the mask must not matter
        for t, value in ((logp, float("nan")), (old, float("-inf")), (mu, float("inf")), (ref, -1e4)):
            t.masked_fill_(~mask.bool(), value)
    replay = torch.tensor([True, False, True, False, False, True])[:n]
    return logp, old, adv, mask, mu, ref, replay


def _run(loss_fn, logp, *args, **kwargs):
    leaf = logp.clone().requires_grad_(True)
    out = loss_fn(leaf, *args, **kwargs)
    (grad,) = torch.autograd.grad(out.loss, leaf)
    return out, grad


def _assert_identical(new, old):
    (out, grad), (ref_out, ref_grad) = new, old
    assert torch.equal(out.loss, ref_out.loss), (out.loss.item(), ref_out.loss.item())
    assert torch.equal(grad, ref_grad)
    assert list(out.metrics) == list(ref_out.metrics)  # same keys, same order
    for key, value in out.metrics.items():
        assert torch.equal(value, ref_out.metrics[key]), key


BASE = [
    dict(loss_type=lt, epsilon=eps, epsilon_high=eh, beta=beta, max_completion_length=9)
    for lt, eps, eh, beta in itertools.product(("grpo", "dapo", "dr_grpo"), (0.2, 0.1), (None, 0.28), (0.0, 0.04))
]
BEHAVIOUR = [
    # (off_policy options, call: None = on-policy, "replay" = all rows replayed, "engine" = replay_mask given)
    ({}, None),
    ({"off_policy": "geppo"}, "replay"),
    ({"off_policy": "geppo", "importance_cap": None}, "replay"),
    ({"off_policy": "geppo", "importance_cap": 1.5}, "replay"),
    ({"off_policy": "paper"}, "replay"),
    ({"off_policy": "geppo", "mismatch_correction": "sequence_mask"}, "engine"),
    ({"off_policy": "geppo", "mismatch_correction": "token_truncate", "mismatch_cap": 1.2}, "engine"),
    ({"off_policy": "paper", "mismatch_correction": "token_truncate"}, "engine"),
    ({"off_policy": "paper", "mismatch_correction": None}, "engine"),
    ({"off_policy": "geppo", "mismatch_correction": "sequence_mask", "mismatch_cap": 1.1}, "engine"),
]


@pytest.mark.parametrize("garbage", [False, True])
@pytest.mark.parametrize(("extra", "mode"), BEHAVIOUR)
@pytest.mark.parametrize("base", BASE)
def test_new_loss_is_bit_identical_to_the_frozen_one(base, extra, mode, garbage):
    for seed in range(3):
        logp, old, adv, mask, mu, ref, replay = _batch(seed, garbage=garbage)
        kwargs = {"ref_logprobs": ref if base["beta"] > 0 or seed == 1 else None}
        if mode is not None:
            kwargs["behaviour_logprobs"] = mu
        if mode == "engine":
            kwargs["replay_mask"] = replay
        options = {**base, **extra}
        new = _run(GRPOLoss(**options), logp, old, adv, mask, **kwargs)
        frozen = _run(FrozenGRPOLoss(**options), logp, old, adv, mask, **kwargs)
        _assert_identical(new, frozen)


def test_defaults_are_bit_identical_with_the_new_keyword_arguments_left_at_none():
    logp, old, adv, mask, mu, ref, replay = _batch(7)
    new = _run(GRPOLoss(), logp, old, adv, mask, entropy=None, entropy_threshold=None, truncated=None)
    _assert_identical(new, _run(FrozenGRPOLoss(), logp, old, adv, mask))
    # a `truncated` flag is ignored while mask_truncated_completions is False (the default)
    new = _run(GRPOLoss(), logp, old, adv, mask, truncated=torch.ones(6, dtype=torch.bool))
    _assert_identical(new, _run(FrozenGRPOLoss(), logp, old, adv, mask))
