import math

import pytest
import torch
import torch.nn.functional as F

from lit_rlft.core.logprobs import completion_logprobs, entropy_from_logits, selective_log_softmax


def _reference(logits, index):
    return F.log_softmax(logits.float(), dim=-1).gather(-1, index.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("chunk_size", [1, 3, 128])
def test_selective_log_softmax_matches_log_softmax_gather(chunk_size):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 4  # [N, L, V], more rows than the smallest chunks
    index = torch.randint(0, 11, (3, 5), generator=g)
    out = selective_log_softmax(logits, index, chunk_size=chunk_size)
    assert out.shape == (3, 5)
    torch.testing.assert_close(out, _reference(logits, index))


def test_selective_log_softmax_gradient_matches():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 7, generator=g, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 7, (4,), generator=g)
    (grad,) = torch.autograd.grad(selective_log_softmax(logits, index).sum(), logits)
    (expected,) = torch.autograd.grad(_reference(logits, index).sum(), logits)
    torch.testing.assert_close(grad, expected)


def test_selective_log_softmax_bf16_is_close_to_float32():
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(2, 6, 50, generator=g) * 10 + 30).bfloat16()  # large offset: logsumexp cancellation
    index = torch.randint(0, 50, (2, 6), generator=g)
    out = selective_log_softmax(logits, index)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), _reference(logits, index), atol=0.05, rtol=0.02)


def test_selective_log_softmax_hand_value_and_shape_check():
    # softmax([0, ln 3]) = [1/4, 3/4]
    logits = torch.tensor([[0.0, math.log(3.0)]])
    torch.testing.assert_close(selective_log_softmax(logits, torch.tensor([1])), torch.tensor([math.log(0.75)]))
    with pytest.raises(ValueError, match="index"):
        selective_log_softmax(logits, torch.tensor([[1]]))


def test_entropy_of_uniform_is_log_v():
    logits = torch.zeros(2, 3, 10)  # [N, L, V=10], uniform rows
    torch.testing.assert_close(entropy_from_logits(logits, chunk_size=4), torch.full((2, 3), math.log(10.0)))


def test_entropy_hand_value_and_masked_vocabulary():
    # p = [1/4, 3/4]: H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.3465736 + 0.2157616 = 0.5623351
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, float("-inf")]])
    # second row: one token has probability 1, the other 0 (-inf logit): H = 0, not NaN
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([0.5623351, 0.0]))


def test_completion_logprobs_divides_by_temperature():
    # logits [0, 2 ln 3] at temperature 2 become [0, ln 3]: p = [1/4, 3/4]
    logits = torch.tensor([[[0.0, 2 * math.log(3.0)], [0.0, 0.0]]], requires_grad=True)  # [N=1, L=2, V=2]
    ids = torch.tensor([[1, 0]])  # [N, L]
    logprobs, entropy = completion_logprobs(logits, ids, temperature=2.0)
    # token 0: ln(3/4); token 1: uniform, ln(1/2); entropies 0.5623351 and ln 2
    torch.testing.assert_close(logprobs, torch.tensor([[math.log(0.75), math.log(0.5)]]))
    torch.testing.assert_close(entropy, torch.tensor([[0.5623351, math.log(2.0)]]))
    assert logprobs.requires_grad and not entropy.requires_grad
    # temperature 1 is plain log-softmax
    logprobs_t1, _ = completion_logprobs(logits, ids)
    torch.testing.assert_close(logprobs_t1, _reference(logits, ids))


def test_completion_logprobs_returns_float32_and_validates():
    logits = torch.randn(2, 3, 5).bfloat16()
    logprobs, entropy = completion_logprobs(logits, torch.zeros(2, 3, dtype=torch.long))
    assert logprobs.dtype == entropy.dtype == torch.float32
    with pytest.raises(ValueError, match="temperature"):
        completion_logprobs(logits, torch.zeros(2, 3, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="completion_ids"):
        completion_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
