"""DOTS, dynamic sampling, replay and DPS with a DOTS cold start inside a real Trainer on the tiny policy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_rlft.callbacks import (
    DifficultyPredictorConfig,
    DOTSCallback,
    DPSCallback,
    DynamicSamplingCallback,
    ReplayCallback,
)
from lit_rlft.rewards.runner import RewardResult
from tests.conftest import countdown_dm, tiny_module, tiny_trainer


class CoinRewards:
    """Reward 1 with probability ``p`` per completion: groups are a mix of effective and degenerate ones."""

    def __init__(self, p: float = 0.5, seed: int = 0):
        self.p, self.gen, self.totals = p, torch.Generator().manual_seed(seed), {}

    def __call__(self, completions, columns):
        total = (torch.rand(len(completions), generator=self.gen) < self.p).float()
        return RewardResult(total=total, per_func={"coin": total}, num_errors=0, num_timeouts=0, num_unscored=0)


def _fit(tmp_path, callbacks, steps=4, p=0.5, **module_kw):
    module = tiny_module(learning_rate=1e-3, **module_kw)
    module.grpo.scorer = CoinRewards(p)
    trainer = tiny_trainer(tmp_path, max_steps=steps, callbacks=callbacks)
    trainer.fit(module, datamodule=countdown_dm(size=48, batch_size=4))
    return module, trainer


def test_dots_rolls_out_reference_sets_charged_to_the_budget(tmp_path):
    cb = DOTSCallback(reference_size=8, update_every=2, online_steps_per_update=2, cache_dir=str(tmp_path / "c"))
    module, trainer = _fit(tmp_path, [cb], steps=4)
    # reference sets before steps 0 and 2; none after the last step (nothing would train on it): 2 x 8 x G=4
    assert module.grpo.budget.by_purpose["reference"] == 2 * 8 * 4
    assert module.grpo.budget.by_purpose["train"] == 4 * 4 * 4
    assert "dots/effective_ratio" in trainer.callback_metrics
    assert list((tmp_path / "c").glob("*.pt")), "pool embeddings were not cached"


def test_dots_rejects_bad_options():
    with pytest.raises(ValueError, match="tau"):
        DOTSCallback(tau=0.0)
    with pytest.raises(ValueError, match="update_every"):
        DOTSCallback(update_every=0)


def test_dynamic_sampling_keeps_only_effective_groups_and_counts_discards(tmp_path):
    module, trainer = _fit(tmp_path, [DynamicSamplingCallback(max_rounds=6)], steps=2, p=0.3)
    m = trainer.callback_metrics
    assert float(m["effective_ratio"]) == 1.0
    assert float(m["dynamic_sampling/rolled_out_groups"]) >= 4
    extra = module.grpo.budget.by_purpose.get("dynamic_sampling", 0)
    rolled = float(m["dynamic_sampling/rolled_out_groups"])
    assert module.grpo.budget.completions == 2 * 4 * 4 + extra  # 2 steps x B=4 x G=4, plus the extra rounds
    assert rolled * 4 <= module.grpo.budget.completions


def test_dynamic_sampling_warns_and_trains_on_what_it_kept(tmp_path):
    with pytest.warns(UserWarning, match="effective groups after"):
        module, trainer = _fit(tmp_path, [DynamicSamplingCallback(max_rounds=2)], steps=1, p=0.0)
    assert float(trainer.callback_metrics["dynamic_sampling/filled"]) == 0.0
    assert module.grpo.rollout_step == 1


def test_replay_mixes_stored_groups_with_importance_weights(tmp_path):
    replay = ReplayCallback(delta=0.5, capacity=16)
    module, trainer = _fit(tmp_path, [replay], steps=5)
    m = trainer.callback_metrics
    assert float(m["replay/replayed_groups"]) + float(m["replay/fresh_groups"]) == 4
    assert float(m["replay/replayed_groups"]) > 0 and float(m["replay/mean_age"]) >= 1
    assert "sampling/importance_sampling_ratio/mean" in m
    assert len(replay.buffer) > 0 and all(0 < g.success_rate < 1 for g in replay.buffer.sample(100))
    # fresh generation is delta * B = 2 prompts per step once the buffer can serve the rest
    assert module.grpo.budget.prompts < 5 * 4


def test_dps_with_dots_cold_start(tmp_path):
    cold = DifficultyPredictorConfig(reference_size=8, update_every=100, online_steps_per_update=1,
                                     cache_dir=str(tmp_path / "c"))
    cb = DPSCallback(cold_start=cold)
    module, trainer = _fit(tmp_path, [cb], steps=3)
    assert "dps/cold_start_pearson" in trainer.callback_metrics
    assert module.grpo.budget.by_purpose["reference"] == 8 * 4  # one reference set at the start
    assert cb._cold_success.shape == (48,) and ((cb._cold_success >= 0) & (cb._cold_success <= 1)).all()
    # Before each selection, never-seen prompts get their cold-start belief instead of the uniform one.
    cb.before_select(module.grpo, step=1)
    never_seen = ~cb.strategy.seen
    assert not torch.allclose(torch.as_tensor(cb.strategy.mu_prior[never_seen]), torch.full((1, 3), 1 / 3).double())


def test_dps_content_prior_from_observed_prompts_costs_no_rollouts(tmp_path):
    """reference="observed": the prompts DPS observed last are the reference set; nothing is rolled out for it, the
    first selection has no prior (nothing observed), and the reference is exactly the last observations."""
    from lit_rlft.callbacks.difficulty import refresh_reference
    cold = DifficultyPredictorConfig(reference_size=6, reference="observed", update_every=1,
                                     online_steps_per_update=1, cache_dir=str(tmp_path / "c"))
    cb = DPSCallback(cold_start=cold)
    module, trainer = _fit(tmp_path, [cb], steps=3)
    assert "reference" not in module.grpo.budget.by_purpose  # no reference rollouts
    assert module.grpo.budget.completions == 3 * 4 * 4  # the 3 training batches only
    ids, _ = cb.cold.reference  # set before step 2's selection, from what steps 0-1 observed
    assert len(ids) == 6 and set(ids.tolist()) <= set(np.flatnonzero(cb.strategy.seen).tolist())
    refresh_reference(cb.cold, module.grpo, cb.rng, "observed")
    ids, difficulties = cb.cold.reference
    latest = cb.cold.latest_observations(6)
    assert ids.tolist() == latest[0].tolist() and np.allclose(difficulties, 1 - latest[1])
    cb.before_select(module.grpo, step=3)  # unseen prompts start from the predicted success
    never_seen = ~cb.strategy.seen
    assert not torch.allclose(torch.as_tensor(cb.strategy.mu_prior[never_seen]), torch.full((1, 3), 1 / 3).double())
    with pytest.raises(ValueError, match="reference must be 'rollout' or 'observed'"):
        DifficultyPredictorConfig(reference="oracle")


def test_budget_stop_ends_training_at_equal_cost(tmp_path):
    from lit_rlft.callbacks import RolloutBudgetStop

    module, _ = _fit(tmp_path, [RolloutBudgetStop(max_completions=40)], steps=100)
    assert module.grpo.rollout_step == 3 and module.grpo.budget.completions == 48  # 16 completions per step, 48 >= 40


def test_dots_logs_an_out_of_sample_pearson_on_each_new_reference_set(tmp_path):
    cb = DOTSCallback(reference_size=8, update_every=1, online_steps_per_update=2, cache_dir=str(tmp_path / "c"))
    _, trainer = _fit(tmp_path, [cb], steps=3)
    assert -1.0 <= float(trainer.callback_metrics["dots/reference_pearson"]) <= 1.0


def test_dynamic_sampling_shows_selection_every_group_it_paid_for(tmp_path):
    """DPS stacked with dynamic sampling observes the discarded candidates too (their all-solved / all-wrong outcomes
    were paid for), and the step's generation time covers every round."""
    import lightning as L

    records = []

    class Keep(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            records.append(outputs["record"])

    dps = DPSCallback()
    module, trainer = _fit(tmp_path, [DynamicSamplingCallback(max_rounds=4), dps, Keep()], steps=1, p=0.3)
    m = trainer.callback_metrics
    rolled_out = int(m["dynamic_sampling/rolled_out_groups"])
    assert rolled_out > 4, "a single round: the test would not see the discarded groups"
    assert int(dps.strategy.seen.sum()) == rolled_out
    assert float(m["time/generation_s"]) == pytest.approx(module.grpo.budget.generation_s)
    # the per-function reward mean covers every round, not only the first
    fresh = records[0].fresh()
    assert fresh.num_groups == rolled_out
    assert float(m["rewards/coin/mean"]) == pytest.approx(float(fresh.reward_per_func["coin"].mean()))


def test_mopps_and_greso_in_a_trainer_log_their_telemetry(tmp_path):
    from lit_rlft.callbacks import GRESOCallback, MoPPSCallback

    mopps = MoPPSCallback(candidate_ratio=2)
    _, trainer = _fit(tmp_path / "m", [mopps], steps=3)
    m = trainer.callback_metrics
    assert 0 < float(m["mopps/posterior_mean_selected"]) < 1 and float(m["mopps/observed_prompts"]) == 12
    assert int(mopps.strategy.num_observed.sum()) == 3 * 4  # every rolled-out group updated its posterior
    greso = GRESOCallback(initial_p=0.0, min_keep=0.0)
    # every group all wrong: after one epoch of the 48-prompt pool (12 steps of 4) every candidate has a hard streak
    _, trainer = _fit(tmp_path / "g", [greso], steps=14, p=0.0)
    m = trainer.callback_metrics
    assert float(m["greso/zero_variance_hard"]) == 1.0 and float(m["greso/skipped_hard"]) > 0
    assert float(m["greso/p_hard"]) == 0.0


def _degenerate_strategies(tmp):
    from lit_rlft.callbacks import GRESOCallback, MoPPSCallback

    return {
        "uniform": [],
        "dps": [DPSCallback()],
        "dots": [DOTSCallback(reference_size=8, update_every=2, online_steps_per_update=2,
                              cache_dir=str(tmp / "c"))],
        "dynamic_sampling": [DynamicSamplingCallback(max_rounds=2)],
        "replay": [ReplayCallback(delta=0.5, capacity=8)],
        "dps+replay": [DPSCallback(), ReplayCallback(delta=0.5, capacity=8)],
        "mopps": [MoPPSCallback(candidate_ratio=2)],
        "greso": [GRESOCallback()],
    }


@pytest.mark.parametrize("p", [0.0, 1.0], ids=["all-unsolved", "all-solved"])
@pytest.mark.parametrize("name", ["uniform", "dps", "dots", "dynamic_sampling", "replay", "dps+replay", "mopps",
                                  "greso"])
def test_degenerate_data_keeps_running_and_says_there_is_no_signal(tmp_path, name, p):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module, trainer = _fit(tmp_path, _degenerate_strategies(tmp_path)[name], steps=3, p=p)
    assert module.grpo.rollout_step == 3
    assert all(torch.isfinite(q).all() for q in module.policy.parameters())
    m = trainer.callback_metrics
    assert float(m["batch/no_signal"]) == 1.0 and float(m["effective_ratio"]) == 0.0
    non_finite = {k: float(v) for k, v in m.items() if not torch.isfinite(torch.as_tensor(v, dtype=torch.float32))}
    assert non_finite == {}, non_finite  # nothing divided by zero
    assert any("carries no learning signal" in str(w.message) for w in caught)
