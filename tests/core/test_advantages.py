import math

import pytest
import torch

from lit_rlft.core.advantages import group_advantages, success_rates

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
