"""OutcomeRecord: built from rollouts without tokens, concatenated, and split into fresh / trained rows."""

from __future__ import annotations

import torch

from lit_rlft.core.types import OutcomeRecord


def _record(ids, rates, replay=None, trained=True) -> OutcomeRecord:
    G = 4
    correct = torch.tensor([[i < round(r * G) for i in range(G)] for r in rates])
    n = len(ids)
    return OutcomeRecord(
        prompt_ids=torch.tensor(ids), rewards=correct.float(), correct=correct,
        is_replay=torch.tensor(replay or [False] * n), trained=torch.full((n,), trained),
        reward_per_func={"f": correct.float()},
    )


def test_concat_keeps_order_and_fills_missing_per_function_scores_with_nan():
    a = _record([3, 1], [0.5, 1.0])
    b = OutcomeRecord(prompt_ids=torch.tensor([7]), rewards=torch.zeros(1, 4), correct=torch.zeros(1, 4, dtype=bool),
                      is_replay=torch.tensor([True]), trained=torch.tensor([True]))
    both = OutcomeRecord.concat([a, b])
    assert both.prompt_ids.tolist() == [3, 1, 7]
    assert both.success_rates.tolist() == [0.5, 1.0, 0.0]
    assert torch.isnan(both.reward_per_func["f"][2]).all() and not torch.isnan(both.reward_per_func["f"][:2]).any()


def test_fresh_and_trained_rows():
    rec = OutcomeRecord.concat([_record([1, 2], [0.25, 0.75], replay=[False, True]),
                                _record([5], [0.0], trained=False)])
    assert rec.fresh().prompt_ids.tolist() == [1, 5]  # discarded candidates are observed too
    assert rec.trained_batch().prompt_ids.tolist() == [1, 2]
    assert rec.select(torch.tensor([2, 0])).prompt_ids.tolist() == [5, 1]
    assert rec.with_trained(False).trained.tolist() == [False] * 3
