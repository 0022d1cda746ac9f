"""Reward functions (TRL's convention) and the runner that combines them.

A reward function is ``fn(completions: list[str], **columns) -> list[float | None]``: one score per completion,
``columns`` holding the data set's other fields as lists aligned with ``completions``; None means "could not be
scored". YAML names them by dotted path, e.g. ``lit_rlft.rewards.math_reward``.

Reward models (:class:`RewardModel`), LLM judges (:class:`JudgeReward`) and remote scorers (:class:`RemoteReward`)
are :class:`BatchedReward` subclasses: scored over the batch in the training process, beside the rule rewards.
"""

from lit_rlft.rewards.answer_format import AnswerFormatReward, extract_answer, write_answer
from lit_rlft.rewards.batched import BatchedReward, Failure, ScoreCache
from lit_rlft.rewards.countdown import CountdownReward, countdown_answer, countdown_reward, parse_expression
from lit_rlft.rewards.exact import exact_match_reward
from lit_rlft.rewards.gsm8k import gsm8k_format_reward, gsm8k_gold, gsm8k_prediction, gsm8k_reward, parse_number
from lit_rlft.rewards.judge import JudgeReward, OpenAIJudge, ScoreParser
from lit_rlft.rewards.math import extract_boxed, math_answer_from_solution, math_reward, verify_math_answer
from lit_rlft.rewards.model import RewardModel
from lit_rlft.rewards.overlong import SoftOverlongPunishment, soft_overlong_punishment
from lit_rlft.rewards.reasoning_gym import ReasoningGymReward
from lit_rlft.rewards.remote import RemoteReward
from lit_rlft.rewards.runner import RewardFunc, RewardResult, RewardRunner, resolve_reward, reward_name

__all__ = [
    "AnswerFormatReward",
    "BatchedReward",
    "CountdownReward",
    "Failure",
    "JudgeReward",
    "OpenAIJudge",
    "ReasoningGymReward",
    "RemoteReward",
    "RewardModel",
    "ScoreCache",
    "ScoreParser",
    "RewardFunc",
    "RewardResult",
    "RewardRunner",
    "SoftOverlongPunishment",
    "countdown_answer",
    "countdown_reward",
    "exact_match_reward",
    "extract_answer",
    "extract_boxed",
    "gsm8k_format_reward",
    "gsm8k_gold",
    "gsm8k_prediction",
    "gsm8k_reward",
    "math_answer_from_solution",
    "math_reward",
    "parse_expression",
    "parse_number",
    "resolve_reward",
    "reward_name",
    "soft_overlong_punishment",
    "verify_math_answer",
    "write_answer",
]
