import math

import numpy as np
import pytest
import torch

from lit_rlft.core.advantages import group_advantages, keep_mask, success_rates

# Two groups (B=2) of three completions (G=3):
#   group 0: [0, 2, 4]  mean 2, deviations [-2, 0, 2], unbiased var (4 + 0 + 4) / 2 = 4, std 2
#   group 1: [0, 0, 3]  mean 1, deviations [-1, -1, 2], unbiased var (1 + 1 + 4) / 2 = 3, std sqrt(3)
REWARDS = torch.tensor([[0.0, 2.0, 4.0], [0.0, 0.0, 3.0]])


def test_scale_none_is_mean_centred_only():
    # Dr. GRPO: just the deviations from each group's mean
    expected = torch.tensor([[-2.0, 0.0, 2.0], [-1.0, -1.0, 2.0]])
    torch.testing.assert_close(group_advantages(REWARDS, "none"), expected)


def test_scale_group_divides_by_each_groups_unbiased_std():
    # group 0: [-2, 0, 2] / 2 = [-1, 0, 1]; group 1: [-1, -1, 2] / sqrt(3)
    s3 = math.sqrt(3.0)
    expected = torch.tensor([[-1.0, 0.0, 1.0], [-1 / s3, -1 / s3, 2 / s3]])
    torch.testing.assert_close(group_advantages(REWARDS, "group", eps=0.0), expected)
    # with the default eps the divisor is std + 1e-4: 2.0001 and 1.7321508
    expected_eps = torch.tensor([[-2 / 2.0001, 0.0, 2 / 2.0001], [-1 / (s3 + 1e-4), -1 / (s3 + 1e-4), 2 / (s3 + 1e-4)]])
    torch.testing.assert_close(group_advantages(REWARDS), expected_eps)


def test_scale_batch_divides_by_the_std_of_all_rewards():
    # all six rewards [0, 2, 4, 0, 0, 3]: mean 9 / 6 = 1.5,
    # squared deviations 2.25 + 0.25 + 6.25 + 2.25 + 2.25 + 2.25 = 15.5, unbiased var 15.5 / 5 = 3.1
    # the centring is still per group: [[-2, 0, 2], [-1, -1, 2]] / sqrt(3.1)
    std = math.sqrt(3.1)
    expected = torch.tensor([[-2.0, 0.0, 2.0], [-1.0, -1.0, 2.0]]) / std
    torch.testing.assert_close(group_advantages(REWARDS, "batch", eps=0.0), expected)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_zero_variance_group_gives_zero_advantages(scale):
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    adv = group_advantages(rewards, scale)
    torch.testing.assert_close(adv[0], torch.zeros(3))
    assert torch.isfinite(adv).all()
    # a whole batch of identical rewards (zero batch std) is zero too, not NaN
    torch.testing.assert_close(group_advantages(torch.ones(2, 3), scale), torch.zeros(2, 3))


def test_single_completion_groups_are_zero_not_nan():
    # unbiased std of one value is NaN; the advantage is 0 anyway
    torch.testing.assert_close(group_advantages(torch.tensor([[1.0], [0.0]])), torch.zeros(2, 1))


def test_output_is_float32_for_integer_and_half_rewards():
    assert group_advantages(torch.tensor([[1, 0]])).dtype == torch.float32
    assert group_advantages(torch.tensor([[1.0, 0.0]], dtype=torch.bfloat16)).dtype == torch.float32


def test_invalid_arguments_are_named():
    with pytest.raises(ValueError, match="scale_rewards.*'std'"):
        group_advantages(REWARDS, "std")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(torch.zeros(6))


def test_success_rates():
    correct = torch.tensor([[True, False, False, True], [False, False, False, False]])
    # 2 of 4 correct, 0 of 4
    torch.testing.assert_close(success_rates(correct), torch.tensor([0.5, 0.0]))
    torch.testing.assert_close(success_rates(torch.tensor([[1, 1, 1], [0, 1, 0]])), torch.tensor([1.0, 1 / 3]))


# -- groups of different sizes: padded to the largest, with a members mask ------------------------------------------
def _ragged() -> tuple[torch.Tensor, torch.Tensor]:
    rewards = torch.tensor([[1.0, 0.0, 1.0, 99.0], [0.0, 0.0, -5.0, 7.0], [0.5, 2.0, 1.0, 0.0]])  # 99, -5, 7: padding
    members = torch.tensor([[True, True, True, False], [True, True, False, False], [True, True, True, True]])
    return rewards, members


def test_ragged_advantages_by_hand():
    rewards, members = _ragged()
    none = group_advantages(rewards, "none", members=members)
    third = 1.0 / 3.0
    assert torch.allclose(none[0], torch.tensor([third, -2 * third, third, 0.0]))  # mean 2/3 over 3 members
    assert torch.equal(none[1], torch.zeros(4))  # two equal members: no signal, padding 0
    scaled = group_advantages(rewards, "group", eps=0.0, members=members)
    std0 = (((third) ** 2 * 2 + (2 * third) ** 2) / 2) ** 0.5  # unbiased over the 3 members: sqrt(1/3)
    assert torch.allclose(scaled[0], torch.tensor([third, -2 * third, third, 0.0]) / std0)
    assert torch.equal(group_advantages(rewards, "group", members=members)[1], torch.zeros(4))  # 0 / eps


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_ragged_advantages_equal_each_group_alone(scale):
    rewards, members = _ragged()
    ragged = group_advantages(rewards, scale, members=members)
    real = [rewards[b][members[b]] for b in range(3)]
    whole_std = torch.cat(real).std()
    for b, r in enumerate(real):
        alone = r - r.mean()
        if scale == "group":
            alone = alone / ((r.std() if len(r) > 1 else 0.0) + 1e-4)
        elif scale == "batch":
            alone = alone / (whole_std + 1e-4)
        assert torch.allclose(ragged[b][members[b]], alone, atol=1e-6), (scale, b)
        assert torch.equal(ragged[b][~members[b]], torch.zeros(int((~members[b]).sum())))


def test_ragged_statistics_ignore_what_padding_holds():
    rewards, members = _ragged()
    other = rewards.clone()
    other[~members] = torch.tensor([-3.0, 1e6, 0.25])
    for scale in ("group", "batch", "none"):
        assert torch.equal(group_advantages(rewards, scale, members=members),
                           group_advantages(other, scale, members=members))
    correct = rewards >= 1.0
    assert torch.allclose(success_rates(correct, members), torch.tensor([2 / 3, 0.0, 0.5]))
    # the first group's padding (99) would make a spread without the mask; the second's (-5, 7) too
    assert keep_mask(rewards.numpy(), members.numpy()).tolist() == [True, False, True]
    assert keep_mask(torch.tensor([[1.0, 1.0, 0.0]]).numpy(), np.array([[True, True, False]])).tolist() == [False]


def test_full_members_give_the_unmasked_values_and_bad_members_are_refused():
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.2, 0.4, 0.4, 0.9]])
    full = torch.ones_like(rewards, dtype=torch.bool)
    for scale in ("group", "batch", "none"):
        assert torch.allclose(group_advantages(rewards, scale, members=full), group_advantages(rewards, scale),
                              atol=1e-6)
    with pytest.raises(ValueError, match="at least one member"):
        group_advantages(rewards, members=torch.tensor([[True] * 4, [False] * 4]))
    with pytest.raises(ValueError, match="shape of the rewards"):
        success_rates(rewards > 0, torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="batch_members"):
        group_advantages(rewards, "batch", members=full, batch_rewards=rewards)
