"""Multi-turn episodes through the whole step: one turn with an environment trains exactly what a single-turn run
trains, and episodes of several turns train on the policy's tokens only, with their counts logged and charged."""

from __future__ import annotations

import torch

from lit_rlft import build_step
from lit_rlft.callbacks import ReplayCallback
from lit_rlft.envs.base import Environment, EnvStep
from lit_rlft.step import TorchBackend, train
from lit_rlft.step.optim import configure_adamw
from tests.conftest import countdown_dm, tiny_config


class Ends(Environment):
    """Ends every episode at once, without a reward of its own."""

    def step(self, messages, row):
        return EnvStep(done=True)


class TwoTurns(Environment):
    """Answers the first turn with the target, ends the second; rewards 1 when the second turn has an odd number of
    distinct characters (a coin flip that depends on the episode)."""

    name = "two_turns"

    def step(self, messages, row):
        if len(messages) == 1:
            return EnvStep(observation=[{"role": "tool", "content": f"t={row['target']}"}], tool_calls=1)
        return EnvStep(done=True, reward=float(len(set(messages[-1]["content"])) % 2))  # about half the episodes


def _run(steps: int = 2, callbacks=(), **overrides):
    config = tiny_config(learning_rate=1e-2, **overrides)
    step = build_step(config)
    data = countdown_dm(size=32, batch_size=4)
    data.setup("fit")
    step.bind(data, callbacks=list(callbacks))
    opt = configure_adamw(step.policy, step.optim, total_steps=10)
    backend = TorchBackend(step.policy, opt["optimizer"], opt["lr_scheduler"]["scheduler"])
    outs = []
    for out in train(step, backend, list(callbacks)):
        outs.append(out)
        if len(outs) == steps:
            break
    return step, outs


def test_one_turn_with_an_environment_trains_what_single_turn_rollouts_train():
    base, base_outs = _run()
    env, env_outs = _run(environment=Ends(), episodes={"max_turns": 1})
    for a, b in zip(base_outs, env_outs):
        assert torch.equal(a.rollouts.completion_tokens, b.rollouts.completion_tokens)
        assert b.rollouts.policy_mask is None  # no observation anywhere: the single-turn path
        assert a.metrics["loss"] == b.metrics["loss"]
    for (name, p), (_, q) in zip(base.policy.named_parameters(), env.policy.named_parameters()):
        assert torch.equal(p, q), name
    assert env_outs[-1].metrics["episodes/turns_mean"] == 1.0
    assert base.budget.tokens == env.budget.tokens


def test_episodes_of_several_turns_train_on_the_policy_tokens_and_are_counted():
    step, outs = _run(environment=TwoTurns(), episodes={"max_turns": 3, "max_tokens": 80},
                      reward_funcs=["lit_rlft.envs.environment_reward"])
    r = outs[-1].rollouts
    assert r.policy_mask is not None
    obs = (r.completion_mask - r.policy_mask).sum(1)  # [N] observation tokens of each episode
    assert bool((obs > 0).any()) and bool(((r.policy_mask == 1) <= (r.completion_mask == 1)).all())
    for text, row_obs in zip(r.completions, obs.tolist()):
        if row_obs:  # the observation is in the episode's text, after the first turn
            assert "t=" in text
    m = outs[-1].metrics
    n_obs = int((obs > 0).sum())
    assert m["episodes/tool_calls_mean"] == n_obs / len(obs)
    assert m["episodes/observation_tokens_mean"] == float(obs.float().mean())
    # the budget charges the policy's tokens and the tool calls, not the observations
    assert step.budget.tokens == sum(int(o.rollouts.policy_mask.sum() if o.rollouts.policy_mask is not None
                                         else o.rollouts.completion_mask.sum()) for o in outs)
    assert step.budget.tool_calls == sum(round(o.metrics["episodes/tool_calls_mean"] * 16) for o in outs)
    # rewards come from the environment through its reward function
    ended = [len(t) for t in r.completions]
    assert r.rewards.numel() == len(ended) and set(r.rewards.flatten().tolist()) <= {0.0, 1.0}


def test_replayed_episodes_keep_their_policy_masks():
    replay = ReplayCallback(delta=0.5, capacity=32)
    _, outs = _run(steps=3, callbacks=[replay], environment=TwoTurns(),
                   episodes={"max_turns": 2, "max_tokens": 80}, reward_funcs=["lit_rlft.envs.environment_reward"])
    stored = [replay.buffer.get(i) for i in replay.buffer.prompt_ids()]
    assert stored and all(g.policy_masks is not None for g in stored)
    assert any(bool((m == 0).any()) for g in stored for m in g.policy_masks)  # observations stored as such
    replayed = [o.rollouts for o in outs if bool(o.rollouts.is_replay.any())]
    assert replayed, "nothing was replayed: the test would not see it"
    for r in replayed:
        G = r.group_size
        for b in torch.nonzero(r.is_replay).flatten().tolist():
            rows = slice(b * G, (b + 1) * G)
            assert bool((r.loss_mask[rows] <= r.completion_mask[rows]).all())
            assert bool((r.loss_mask[rows] != r.completion_mask[rows]).any())  # observations stay out of the loss


def test_the_generation_process_rolls_out_episodes_with_its_own_environment_workers():
    """With asynchronous rollouts the generation process builds the episode runner from the config: the rows it
    sends back are episodes (observations inside, left out of the loss)."""
    step, outs = _run(steps=2, environment=TwoTurns(), episodes={"max_turns": 2, "max_tokens": 80},
                      reward_funcs=["lit_rlft.envs.environment_reward"], async_depth=1)
    for out in outs:
        r = out.rollouts
        assert r.policy_mask is not None and bool((r.policy_mask < r.completion_mask).any())
        assert out.metrics["episodes/turns_mean"] > 1.0
    assert step.budget.tool_calls > 0
