"""Tests of DOTS' selection weights and Gumbel-top-k sampling (``lit_rlft.selection.gumbel``)."""

from __future__ import annotations

import pytest
import torch

from lit_rlft.selection.gumbel import difficulty_logits, sample_without_replacement


def test_difficulty_logits():
    # -|d - 0.5| / 0.1 at d = 0.5, 0.6, 0.0 -> 0, -1, -5
    out = difficulty_logits(torch.tensor([0.5, 0.6, 0.0]), alpha=0.5, tau=0.1)
    torch.testing.assert_close(out, torch.tensor([0.0, -1.0, -5.0]))


def test_sampler_distinct_and_respects_exclude():
    g = torch.Generator().manual_seed(0)
    exclude = torch.zeros(50, dtype=torch.bool)
    exclude[::2] = True
    for _ in range(20):
        out = sample_without_replacement(torch.zeros(50), 25, g, exclude)
        assert out.dtype == torch.long and out.unique().numel() == 25
        assert not exclude[out].any()


def test_sampler_never_fails_at_tiny_tau_and_prefers_closest():
    # tau = 1e-9 and every prediction far from alpha: log-weights ~ -1e8 .. -5e8, exp underflows to 0 everywhere
    d_hat = torch.tensor([0.9, 0.95, 0.6, 0.99, 0.7, 0.1, 0.65])
    logw = difficulty_logits(d_hat, alpha=0.5, tau=1e-9)
    assert torch.exp(logw).sum() == 0
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        out = sample_without_replacement(logw, 3, g)
        assert out.tolist() == [2, 6, 4]  # |d - 0.5| = 0.1, 0.15, 0.2 in that order
    out = sample_without_replacement(torch.full((6,), -1e9), 6, g)
    assert sorted(out.tolist()) == list(range(6))


def test_sampler_closest_with_overwhelming_probability_at_default_tau():
    # tau = 1e-3: neighbours 0.01 apart differ by 10 in log-weight, far beyond the Gumbel noise
    d_hat = torch.linspace(0.0, 1.0, 101)  # 0.00, 0.01, ..., 1.00
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        out = sample_without_replacement(difficulty_logits(d_hat), 3, g)
        assert set(out.tolist()) == {49, 50, 51}


def test_sampler_handles_nan_and_inf():
    logw = torch.tensor([float("nan"), -float("inf"), 0.0, -100.0])
    out = sample_without_replacement(logw, 4, torch.Generator().manual_seed(0))
    assert out[:2].tolist() == [2, 3] and sorted(out.tolist()) == [0, 1, 2, 3]


def test_sampler_deterministic_with_seeded_generator():
    logw = torch.randn(100)
    a = sample_without_replacement(logw, 10, torch.Generator().manual_seed(7))
    b = sample_without_replacement(logw, 10, torch.Generator().manual_seed(7))
    assert a.tolist() == b.tolist()


def test_sampler_frequencies_match_weights():
    # first draw of Gumbel-top-k ~ softmax(log-weights): P = (0.5, 0.3, 0.2)
    logw = torch.tensor([0.5, 0.3, 0.2]).log()
    g = torch.Generator().manual_seed(0)
    first = torch.tensor([int(sample_without_replacement(logw, 2, g)[0]) for _ in range(3000)])
    freq = torch.bincount(first, minlength=3).float() / 3000
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.03, rtol=0)


def test_sampler_errors_name_k():
    with pytest.raises(ValueError, match="k=4"):
        sample_without_replacement(torch.zeros(5), 4, exclude=torch.tensor([1, 1, 0, 0, 0], dtype=torch.bool))
    with pytest.raises(ValueError, match="k=-1"):
        sample_without_replacement(torch.zeros(5), -1)
    assert sample_without_replacement(torch.zeros(5), 0).numel() == 0
