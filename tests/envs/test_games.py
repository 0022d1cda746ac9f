"""The guess-the-number game: the environment's answers and rewards, the guess parser, and the seeded task."""

from __future__ import annotations

import pytest

from lit_rlft.data.pool import build_pool
from lit_rlft.data.tasks import Task
from lit_rlft.envs import EnvStep, GuessNumberEnv, GuessNumberTask
from lit_rlft.envs.games import binary_search_guesses, parse_guess


def episode(*turns: str) -> list[dict]:
    """Policy turns, with the feedback the environment gave in between (content irrelevant to a stateless env)."""
    messages: list[dict] = []
    for i, text in enumerate(turns):
        if i:
            messages.append({"role": "user", "content": "higher"})
        messages.append({"role": "assistant", "content": text})
    return messages


ROW = {"prompt": "Guess my number between 1 and 16.", "target": 11}


# ---------------------------------------------------------------------------------------------------- environment


def test_a_low_guess_is_answered_higher():
    assert GuessNumberEnv().step(episode("<guess>8</guess>"), ROW) == EnvStep(
        observation=[{"role": "user", "content": "higher"}]
    )


def test_a_high_guess_is_answered_lower():
    step = GuessNumberEnv().step(episode("<guess>8</guess>", "<guess>14</guess>"), ROW)
    assert step == EnvStep(observation=[{"role": "user", "content": "lower"}])
    assert (step.done, step.reward) == (False, None)


def test_the_right_guess_ends_with_reward_1():
    assert GuessNumberEnv().step(episode("<guess>8</guess>", "I think <guess> 11 </guess>"), ROW) == EnvStep(
        done=True, reward=1.0
    )


@pytest.mark.parametrize("text", ["eleven", "<guess>eleven</guess>", "<guess>11", "<guess></guess>", "11", ""])
def test_no_readable_guess_ends_with_reward_0(text: str):
    assert GuessNumberEnv().step(episode(text), ROW) == EnvStep(done=True, reward=0.0)


def test_the_last_guess_tag_counts():
    env = GuessNumberEnv()
    assert env.step(episode("<guess>3</guess> no, <guess>11</guess>"), ROW) == EnvStep(done=True, reward=1.0)
    assert env.step(episode("<guess>11</guess> no, <guess>3</guess>"), ROW).observation[0]["content"] == "higher"


def test_target_column_and_row_bounds():
    env = GuessNumberEnv(target_column="secret", low=1, high=10)
    assert env.step(episode("<guess>50</guess>"), {"secret": "42", "high": 64}).observation[0]["content"] == "lower"
    with pytest.raises(ValueError, match=r"target 42 is outside \[1, 10\]"):
        env.step(episode("<guess>5</guess>"), {"secret": 42})
    with pytest.raises(ValueError, match="no column 'secret'"):
        env.step(episode("<guess>5</guess>"), {"target": 5})
    with pytest.raises(ValueError, match="must be an integer"):
        env.step(episode("<guess>5</guess>"), {"secret": 2.5})


@pytest.mark.parametrize(
    ("text", "guess"),
    [
        ("<guess>7</guess>", 7),
        ("<guess> -3 </guess>", -3),
        ("<guess>1</guess><guess>2</guess>", 2),
        ("<guess>1</guess> then <guess>x</guess>", None),
        ("<guess>" + "9" * 40 + "</guess>", None),
        ("<guess>٣</guess>", None),  # a non-ASCII digit
        ("</guess><guess>5", None),
    ],
)
def test_parse_guess(text: str, guess: int | None):
    assert parse_guess(text) == guess


# ----------------------------------------------------------------------------------------------------------- task


def test_task_records_are_deterministic_and_in_range():
    a = GuessNumberTask(size=200, seed=3).records()
    b = GuessNumberTask(size=200, seed=3).records()
    assert [(r.data, r.origin) for r in a] == [(r.data, r.origin) for r in b]
    assert [r.data for r in GuessNumberTask(size=200, seed=4).records()] != [r.data for r in a]
    assert all(1 <= r.data["target"] <= 16 for r in a)
    assert isinstance(GuessNumberTask(), Task)


def test_task_record_fields():
    rec = GuessNumberTask(size=1, low=1, high=16, split="all").records()[0]
    target = rec.data["target"]
    assert rec.data == {
        "prompt": "Guess my number between 1 and 16. Answer with <guess>N</guess>.\n",
        "target": target,
        "low": 1,
        "high": 16,
        "answer": str(target),
        "difficulty": binary_search_guesses(1, 16, target),
    }
    assert rec.origin == "generated:guess_number#0"


def test_train_and_test_targets_are_disjoint_and_cover_the_range():
    train = {r.data["target"] for r in GuessNumberTask(size=500, split="train").records()}
    test = {r.data["target"] for r in GuessNumberTask(size=500, split="test", seed=1).records()}
    assert train and test and not train & test
    assert train | test == set(range(1, 17))


def test_unique_and_too_small():
    records = GuessNumberTask(size=16, split="all", unique=True).records()
    assert sorted(r.data["target"] for r in records) == list(range(1, 17))
    with pytest.raises(ValueError, match="GuessNumberTask: collected only 16 of size=17"):
        GuessNumberTask(size=17, split="all", unique=True).records()


@pytest.mark.parametrize(("target", "guesses"), [(8, 1), (4, 2), (12, 2), (16, 5), (1, 4), (11, 4)])
def test_binary_search_guesses(target: int, guesses: int):
    # midpoints for 1..16: 8; then 4 (1..7) or 12 (9..16); 16: 8, 12, 14, 15, 16; 1: 8, 4, 2, 1; 11: 8, 12, 10, 11
    assert binary_search_guesses(1, 16, target) == guesses


def test_task_builds_a_pool_with_the_default_answer_field():
    pool = build_pool(GuessNumberTask(size=8).records())
    assert len(pool) == 8


def test_task_argument_checks():
    with pytest.raises(ValueError, match="low <= high"):
        GuessNumberTask(low=5, high=4)
    with pytest.raises(ValueError, match="size"):
        GuessNumberTask(size=0)


def test_demonstrations_are_consistent_games_laid_out_as_episodes():
    from lit_rlft.envs import GuessNumberDemonstrations
    from lit_rlft.envs.formats import TextFormat
    from lit_rlft.models.tiny import char_tokenizer

    records = GuessNumberDemonstrations(size=300, seed=3).records()
    assert records == GuessNumberDemonstrations(size=300, seed=3).records()
    tok, fmt = char_tokenizer(), TextFormat(char_tokenizer())
    histories = 0
    for r in records:
        target, text = r.data["target"], r.data["prompt"]
        head, *turns = text.split("<guess>")
        assert head == ["Guess my number between 1 and 16. Answer with ", "N</guess>.\n"][0]
        lo, hi = 1, 16
        for turn in turns[1:]:  # the first split piece is the instruction's own "<guess>N</guess>"
            guess, rest = turn.split("</guess>")
            guess = int(guess)
            assert guess != target and lo <= guess <= hi
            feedback = "higher" if target > guess else "lower"
            assert rest == "<eos>" + fmt.text([{"role": "user", "content": feedback}])
            lo, hi = (guess + 1, hi) if target > guess else (lo, guess - 1)
            histories += 1
        assert lo <= int(r.data["solution"][len("<guess>"):-len("</guess>")]) <= hi  # a consistent next guess
    assert histories > 300  # most pairs continue a game
    # the episode runner's layout: the EOS written as text is the EOS token
    ids = tok(records[0].data["prompt"] + "<eos>")["input_ids"]
    assert ids[-1] == tok.eos_token_id
