"""The step's evaluation seam (lit_rlft/step/evaluation.py): a measurement with seeds and a scorer of its own leaves
the run as it found it, and each rollout source says whether it can score with another scorer."""

from __future__ import annotations

import ast

import pytest
import torch

from lit_rlft import build_step
from lit_rlft.rewards.runner import RewardRunner
from lit_rlft.study.evaluation import EvalSeeds
from tests.conftest import REPO, countdown_dm, tiny_config
from tests.step.test_validation import PARITY

ZERO = "tests.step.test_evaluation.zero_reward"


def zero_reward(completions: list[str], **columns) -> list[float]:
    return [0.0] * len(completions)


def _bound_step(**overrides):
    step = build_step(tiny_config(reward_funcs=[PARITY], eval_num_generations=2, **overrides))
    data = countdown_dm(size=16, batch_size=4, val=True, val_batch_size=4)
    data.setup("fit")
    step.bind(data)
    return step, data


def test_an_evaluation_with_its_own_scorer_scores_with_it_and_restores_the_run():
    step, data = _bound_step()
    seeds, scorer = step.rollouts.seeds, step.source.scorer
    step.policy.train()
    own = step.evaluate(EvalSeeds(0))
    assert 0 < own["val/accuracy"] < 1  # the run's parity reward
    zero = step.evaluate(EvalSeeds(0), RewardRunner([ZERO]))
    assert zero["val/accuracy"] == 0 and zero["val/reward"] == 0  # the given scorer scored every completion
    assert step.evaluate(EvalSeeds(0)) == own  # and the run's came back
    assert step.rollouts.seeds is seeds and step.source.scorer is scorer and step.policy.training
    assert step.evaluate(EvalSeeds(1)) != own  # the seeds are the evaluation's own
    state = torch.get_rng_state()
    step.evaluate(EvalSeeds(0))
    assert torch.equal(torch.get_rng_state(), state)  # torch's random state is the run's
    step.close()


def test_the_block_restores_the_run_when_the_measurement_fails():
    step, _ = _bound_step()
    seeds, scorer = step.rollouts.seeds, step.source.scorer
    with pytest.raises(RuntimeError, match="mid-measurement"), step.evaluating(EvalSeeds(0), RewardRunner([ZERO])):
        assert step.source.scorer is not scorer and not step.policy.training
        raise RuntimeError("mid-measurement")
    assert step.rollouts.seeds is seeds and step.source.scorer is scorer and step.policy.training
    step.close()


def test_a_source_that_scores_in_another_process_refuses_another_scorer():
    from lit_rlft.rollout.process import ProcessRollouts

    source = ProcessRollouts.__new__(ProcessRollouts)  # the refusal needs no process
    source.process = None
    with pytest.raises(ValueError, match=r"ProcessRollouts scores in its generation process.*reward_funcs"):
        source.scored_by(RewardRunner([ZERO]))


def test_no_rollout_source_is_told_apart_by_its_type_outside_the_builder():
    """What a caller needs of a source is on the protocol (``scored_by``, ``pending``, ...): no ``isinstance`` on a
    source class anywhere in the package but the step's builder, which chooses one."""
    names = {"InProcessRollouts", "ProcessRollouts", "ServerRollouts", "WorkerRollouts"}
    bad = []
    for path in sorted((REPO / "lit_rlft").rglob("*.py")):
        if path.relative_to(REPO).as_posix() == "lit_rlft/step/builder.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                if any(getattr(c, "id", getattr(c, "attr", None)) in names for c in classes):
                    bad.append(f"{path.relative_to(REPO)} line {node.lineno}")
    assert not bad, "isinstance on a rollout source:\n" + "\n".join(bad)


def test_generation_servers_refuse_another_scorer():
    """As before the seam: servers score training batches on their thread, so a measurement's scorer is refused up
    front (at a study's first evaluation), not when a batch happens to be in flight."""
    from lit_rlft.rollout.servers.source import ServerRollouts

    source = ServerRollouts.__new__(ServerRollouts)  # the refusal needs no server
    with pytest.raises(ValueError, match=r"ServerRollouts scores training batches.*reward_funcs"):
        source.scored_by(RewardRunner([ZERO]))
