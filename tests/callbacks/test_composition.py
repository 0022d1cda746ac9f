"""BatchCompositionLogger: hand-computed bucket shares, and the tags it writes in a real Trainer."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest

from lit_rlft.callbacks.composition import BatchCompositionLogger
from tests.conftest import countdown_dm, tiny_module, tiny_trainer


def test_shares_effective_shares_and_success_rates_by_hand():
    logger = BatchCompositionLogger("difficulty")
    logger.buckets = [2, 3, 4, 5]
    m = logger.composition([2, 2, 3, 4], np.array([1.0, 0.5, 0.25, 0.0]))
    assert m["composition/difficulty_2/share"] == 0.5
    assert m["composition/difficulty_2/effective_share"] == 0.25  # only the 0.5 group is informative
    assert m["composition/difficulty_2/success_rate"] == 0.75
    assert m["composition/difficulty_3/share"] == m["composition/difficulty_3/effective_share"] == 0.25
    assert m["composition/difficulty_4/share"] == 0.25 and m["composition/difficulty_4/effective_share"] == 0.0
    assert m["composition/difficulty_5/share"] == 0.0 and "composition/difficulty_5/success_rate" not in m
    # summed over buckets, the effective shares are the batch's effective ratio (2 of 4 groups)
    assert sum(v for k, v in m.items() if k.endswith("effective_share")) == 0.5


def test_recurrence_counts_distinct_prompts_and_repeated_fresh_ones():
    logger = BatchCompositionLogger()
    assert logger.recurrence([1, 2, 3], [False] * 3) == {"composition/distinct_prompts": 3.0,
                                                        "composition/repeat_share": 0.0}
    # fresh 3 and 4: one of two was trained before; the replayed 1 does not count as a fresh repeat
    m = logger.recurrence([3, 4, 1], [False, False, True])
    assert m == {"composition/distinct_prompts": 4.0, "composition/repeat_share": 0.5}
    restored = BatchCompositionLogger()
    restored.load_state_dict(logger.state_dict())
    assert restored.recurrence([4], [False])["composition/repeat_share"] == 1.0


class _Metrics(L.Callback):
    def __init__(self):
        self.seen: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("composition/")})


def test_logs_every_bucket_of_the_pool_each_step(tmp_path):
    seen = _Metrics()
    trainer = tiny_trainer(tmp_path, max_steps=2, callbacks=[BatchCompositionLogger("difficulty"), seen])
    trainer.fit(tiny_module(), datamodule=countdown_dm(size=48, batch_size=4))  # 2-4 numbers
    assert len(seen.seen) == 2
    for m in seen.seen:
        shares = [m[f"composition/difficulty_{d}/share"] for d in (2, 3, 4)]
        assert sum(shares) == pytest.approx(1.0)
    assert seen.seen[1]["composition/distinct_prompts"] >= seen.seen[0]["composition/distinct_prompts"] >= 4


def test_unknown_column_names_the_available_ones(tmp_path):
    trainer = tiny_trainer(tmp_path, max_steps=1, callbacks=[BatchCompositionLogger("level")])
    with pytest.raises(KeyError, match="level.*difficulty"):
        trainer.fit(tiny_module(), datamodule=countdown_dm(size=16, batch_size=4))
