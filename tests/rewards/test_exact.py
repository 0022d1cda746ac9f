"""Tests of the exact-match reward."""

from lit_rlft.rewards import exact_match_reward


def test_exact_match_reward() -> None:
    completions = [" 42\n", "42", "41", "abc", "x"]
    answers = ["42", 42, "42", " abc ", None]
    assert exact_match_reward(completions, answer=answers, prompts=["p"] * 5) == [1.0, 1.0, 0.0, 1.0, None]
