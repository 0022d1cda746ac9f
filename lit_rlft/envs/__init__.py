"""Multi-turn rollouts: the environment protocol, tool calling (with a calculator tool) and a guessing game.

An environment answers each policy turn with observation messages or the end of the episode (:mod:`.base`);
:class:`ToolEnvironment` runs the tools the policy calls (:mod:`.tools`); :class:`GuessNumberEnv` and
:class:`GuessNumberTask` are a small game to test multi-turn training on (:mod:`.games`);
:class:`CalculatorCountdownDemonstrations` warm-start a policy to call a calculator on Countdown
(:mod:`.calculator_countdown`); observations become tokens through the chat template or a plain-text format
(:mod:`.formats`); the episodes themselves are rolled out by :mod:`lit_rlft.rollout.episodes`.
"""

from lit_rlft.envs.base import Environment, EnvStep, Message, environment_reward
from lit_rlft.envs.calculator_countdown import CalculatorCountdownDemonstrations, tool_call_text
from lit_rlft.envs.formats import ChatFormat, ObservationFormat, TextFormat, observation_format
from lit_rlft.envs.games import GuessNumberDemonstrations, GuessNumberEnv, GuessNumberTask
from lit_rlft.envs.tools import ToolCall, ToolEnvironment, calculator, function_schema, no_network, parse_tool_calls

__all__ = [
    "CalculatorCountdownDemonstrations",
    "ChatFormat",
    "EnvStep",
    "Environment",
    "GuessNumberDemonstrations",
    "GuessNumberEnv",
    "GuessNumberTask",
    "Message",
    "ObservationFormat",
    "TextFormat",
    "ToolCall",
    "ToolEnvironment",
    "calculator",
    "environment_reward",
    "function_schema",
    "no_network",
    "observation_format",
    "parse_tool_calls",
    "tool_call_text",
]
