"""RewardModel: a completion's score is the model's own forward on its text, whatever the micro-batching, padding
side, rank split or cache; TRL's string convention; and batched rewards inside RewardRunner."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_reward_model
from lit_rlft.rewards import BatchedReward, Failure, RewardModel, RewardRunner, resolve_reward
from lit_rlft.rewards.model import token_micro_batches

SMALL = TinyConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                   intermediate_size=128, head_dim=64)
COMPLETIONS = ["(1+2)*3", "9", "a much longer completion: 1+2+3+4 = 10", "x" * 50, "", "7-1"]
PROMPTS = ["Make 9", "Make 9", "Make 10 from 1 2 3 4", "p", "empty", "Make 6"]
CHAT = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")


def one_by_one(model: torch.nn.Module, tok, texts: list[str], special: bool = True) -> list[float]:
    """The reference: each text alone, unpadded, through the model's own forward."""
    out = []
    for text in texts:
        ids = tok(text, add_special_tokens=special)["input_ids"]
        out.append(model(input_ids=torch.tensor([ids])).logits[0, 0].item())
    return out


@pytest.fixture(scope="module")
def rm() -> tuple[torch.nn.Module, object]:
    tok = char_tokenizer()
    return tiny_reward_model(tok, SMALL), tok


def test_token_micro_batches_bound_padded_tokens() -> None:
    lengths = [3, 10, 4, 9, 1, 30]
    batches = token_micro_batches(lengths, 20)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        width = max(lengths[i] for i in batch)
        assert len(batch) * width <= 20 or len(batch) == 1  # a row past the budget goes alone
    assert [5] in batches  # the 30-token row
    assert token_micro_batches([3, 10, 4, 9], 20) == [[1, 3], [2, 0]]
    with pytest.raises(ValueError, match="max_batch_tokens"):
        token_micro_batches([1], 0)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("budget", [1, 64, 100_000])
def test_score_equals_the_models_own_forward(rm, side: str, budget: int) -> None:
    model, tok = rm
    tok.padding_side = side
    reward = RewardModel(model, tok, max_batch_tokens=budget)
    scores = reward.score(COMPLETIONS, {"prompts": PROMPTS})
    expected = one_by_one(model, tok, [p + c for p, c in zip(PROMPTS, COMPLETIONS)])
    assert scores == pytest.approx(expected, abs=1e-5)
    assert reward.num_forwards == len(token_micro_batches([len(p + c) for p, c in zip(PROMPTS, COMPLETIONS)],
                                                           budget))
    assert len(set(round(s, 6) for s in scores)) > 3  # a model that scores everything alike would pass vacuously


def test_rank_split_and_chat_template(rm) -> None:
    """Two halves (what two ranks score) give the whole batch's scores; a chat template renders prompt and
    completion as the model reads them."""
    model, tok = rm
    tok = char_tokenizer()
    tok.chat_template = CHAT
    reward = RewardModel(model, tok, max_batch_tokens=200)
    whole = reward.score(COMPLETIONS, {"prompts": PROMPTS})
    halves = (reward.score(COMPLETIONS[:3], {"prompts": PROMPTS[:3]})
              + reward.score(COMPLETIONS[3:], {"prompts": PROMPTS[3:]}))
    assert halves == pytest.approx(whole, abs=1e-5)
    texts = [f"<user>{p}<eos><assistant>{c}<eos>" for p, c in zip(PROMPTS, COMPLETIONS)]
    assert whole == pytest.approx(one_by_one(model, tok, texts, special=False), abs=1e-5)


def test_max_length_keeps_the_end(rm) -> None:
    model, tok = rm
    tok.padding_side = "right"
    reward = RewardModel(model, tok, max_length=8)
    scores = reward.score(["abcdefghijklmnop"], {"prompts": ["0123"]})
    assert scores == pytest.approx(one_by_one(model, tok, ["ijklmnop"]), abs=1e-5)
    assert reward.num_truncated == 1


def test_trl_string_convention_loads_a_reward_model(rm, tmp_path: Path) -> None:
    model, tok = rm
    model.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    loaded = resolve_reward(str(tmp_path / "rm"))
    assert isinstance(loaded, RewardModel) and loaded.name == "rm"
    tok.padding_side = "right"
    assert loaded.score(COMPLETIONS, {"prompts": PROMPTS}) == pytest.approx(
        RewardModel(model, tok).score(COMPLETIONS, {"prompts": PROMPTS}), abs=1e-5)
    yaml_form = resolve_reward({"class_path": "lit_rlft.rewards.RewardModel",
                                "init_args": {"model": str(tmp_path / "rm"), "max_batch_tokens": 64}})
    assert isinstance(yaml_form, RewardModel) and yaml_form.max_batch_tokens == 64
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_reward(str(tmp_path / "missing" / "rm"))


def test_runner_combines_a_reward_model_with_a_rule_and_caches(rm) -> None:
    model, tok = rm
    tok.padding_side = "left"
    reward = RewardModel(model, tok, name="rm")

    def length(completions: list[str], **kwargs: object) -> list[float]:
        return [float(len(c)) for c in completions]

    expected = one_by_one(model, tok, [p + c for p, c in zip(PROMPTS, COMPLETIONS)])
    with RewardRunner([reward, length], weights=[2.0, 0.5], timeout_s=5.0, num_workers=1) as runner:
        assert runner.batched == [0] and runner.isolated == [1]
        result = runner(COMPLETIONS, {"prompts": PROMPTS, "completion_ids": [[1, 2]] * len(COMPLETIONS)},
                        group_size=2)
        assert result.per_func["rm"].tolist() == pytest.approx(expected, abs=1e-5)
        assert result.total.tolist() == pytest.approx(
            [2 * e + 0.5 * len(c) for e, c in zip(expected, COMPLETIONS)], abs=1e-4)
        forwards = reward.num_forwards
        again = runner(COMPLETIONS[:3] + ["new one"], {"prompts": PROMPTS[:3] + ["p"]})
        assert reward.num_forwards == forwards + 1  # only the new pair went through the model
        assert again.per_func["rm"][:3].tolist() == result.per_func["rm"][:3].tolist()
        assert runner.caches[0].hits == 3


class GroupSpread(BatchedReward):
    """A group-level reward: each completion's rank within its group (0 = shortest), and a record of the calls."""

    group_level = True

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def score(self, completions, columns):
        self.calls.append(list(completions))
        order = sorted(range(len(completions)), key=lambda i: (len(completions[i]), i))
        return [float(order.index(i)) for i in range(len(completions))]


class FailsOnX(BatchedReward):
    name = "fails_on_x"

    def score(self, completions, columns):
        return [Failure("unscored", "no score for x") if c == "x" else 1.0 for c in completions]


def test_group_level_reward_sees_whole_groups_and_failures_stay_alone() -> None:
    group = GroupSpread()
    runner = RewardRunner([group, FailsOnX()], timeout_s=None)
    result = runner(["aaa", "a", "aa", "x", "bb", "b"], {"prompts": ["p"] * 6}, group_size=3)
    assert group.calls == [["aaa", "a", "aa"], ["x", "bb", "b"]]
    assert result.per_func["GroupSpread"].tolist() == [2.0, 0.0, 1.0, 0.0, 2.0, 1.0]
    assert result.per_func["fails_on_x"].tolist() == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert result.num_unscored == 1 and result.failures == {"fails_on_x": {"num_unscored": 1}}
    with pytest.raises(ValueError, match="group size"):
        runner(["a"], {})


def test_batched_reward_contract_errors() -> None:
    class Short(BatchedReward):
        def score(self, completions, columns):
            return [1.0]

    with pytest.raises(ValueError, match="returned 1 scores for 2"):
        RewardRunner([Short()], timeout_s=None)(["a", "b"], {})
    assert Short()(["a"]) == [1.0]  # also a TRL-style function
    assert FailsOnX()(["x", "y"]) == [None, 1.0]


def _sharded_worker(rank: int, port: int, out: str) -> None:
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        tok = char_tokenizer()
        tok.padding_side = "right"
        reward = RewardModel(tiny_reward_model(tok, SMALL), tok, max_batch_tokens=40, device="cpu")
        reward.shard(init_device_mesh("cpu", (2,)))
        mine = COMPLETIONS if rank == 0 else COMPLETIONS[:1]  # 4 micro-batches on rank 0, 1 on rank 1
        prompts = PROMPTS if rank == 0 else PROMPTS[:1]
        scores = reward.score(mine, {"prompts": prompts})
        empty = reward.score([], {})  # a rank with nothing to score still joins its peers' forwards
        reward.score(COMPLETIONS[:2], {"prompts": PROMPTS[:2]})  # the ranks are still in step
        torch.save({"scores": scores, "empty": empty, "real": reward.num_forwards,
                    "padding": reward.num_padding_forwards,
                    "sharded": all(hasattr(p, "device_mesh") for p in reward.model.parameters())},
                   f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_a_sharded_reward_model_scores_as_the_whole_one_with_ranks_of_different_sizes(rm, tmp_path: Path) -> None:
    """FSDP2 over 2 CPU ranks: each rank holds half the weights; ranks with different numbers of micro-batches (and
    one with none) make as many forwards, and every score equals the unsharded model's."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_sharded_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    model, tok = rm
    expected = one_by_one(model, tok, [p + c for p, c in zip(PROMPTS, COMPLETIONS)])
    assert r0["scores"] == pytest.approx(expected, abs=1e-5)
    assert r1["scores"] == pytest.approx(expected[:1], abs=1e-5)
    assert r0["sharded"] and r1["sharded"] and r0["empty"] == r1["empty"] == []
    assert r0["real"] + r0["padding"] == r1["real"] + r1["padding"]
    assert r1["padding"] > 0 and r0["real"] > r1["real"]  # rank 1 joined rank 0's extra forwards
