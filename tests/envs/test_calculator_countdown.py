"""The calculator-on-Countdown demonstrations: laid out exactly as the episodes the environment and the text format
build, every call of the solution hits the target, every shown attempt misses it, every answer scores 1."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from lit_rlft.envs import (
    CalculatorCountdownDemonstrations,
    TextFormat,
    ToolEnvironment,
    calculator,
    parse_tool_calls,
    tool_call_text,
)
from lit_rlft.models.loading import load_tokenizer_for
from lit_rlft.rewards import countdown_reward


def _turns(prompt: str) -> tuple[str, list[str]]:
    """The task's prompt and the calls of the demonstrated episode so far."""
    head, *calls = prompt.split("<tool_call>")
    return head, ["<tool_call>" + c.split("<eos>")[0] for c in calls]


def test_the_prompt_is_the_episode_the_environment_and_text_format_build():
    tok = load_tokenizer_for("tiny")
    fmt, env = TextFormat(tok), ToolEnvironment([calculator])
    records = CalculatorCountdownDemonstrations(size=300, seed=3).records()
    for r in records:
        head, calls = _turns(r.data["prompt"])
        rebuilt = head
        for call in calls:
            step = env.step([{"role": "assistant", "content": call}], {})
            assert step.tool_calls == 1 and step.tool_failures == 0 and not step.done
            rebuilt += call + "<eos>" + fmt.text(step.observation)
        assert rebuilt == r.data["prompt"]
        ids = tok(r.data["prompt"], add_special_tokens=False)["input_ids"]
        assert ids.count(tok.eos_token_id) == len(calls)  # each turn ends with the policy's EOS token
    # a turn without a call ends the episode: the answer turn
    answer = next(r for r in records if r.data["solution"].startswith("<answer>"))
    assert env.step([{"role": "assistant", "content": answer.data["solution"]}], {}).done


def test_attempts_miss_the_target_and_the_solution_hits_it():
    records = CalculatorCountdownDemonstrations(size=400, max_calls=3, seed=1).records()
    kinds, shown = Counter(), Counter()
    for r in records:
        nums, target = r.data["nums"], r.data["target"]
        _, calls = _turns(r.data["prompt"])
        values = [calculator(**parse_tool_calls(c)[0][0].arguments) for c in calls]
        solution = r.data["solution"]
        if solution.startswith("<answer>"):
            kinds["answer"] += 1
            assert values[-1] == str(target)  # answered right after the call that hit
            assert all(v != str(target) for v in values[:-1])
            assert countdown_reward([solution], [nums], [target]) == [1.0]
            assert solution == f"<answer>{parse_tool_calls(calls[-1])[0][0].arguments['expression']}</answer>"
            shown[len(calls) - 1] += 1
        else:
            kinds["call"] += 1
            assert all(v != str(target) for v in values)  # only misses so far: the next turn calls again
            (call,), errors = parse_tool_calls(solution)
            assert not errors and call.name == "calculator" and calculator(**call.arguments) == str(target)
            assert countdown_reward([call.arguments["expression"]], [nums], [target]) == [1.0]
            shown[len(calls)] += 1
    assert min(kinds.values()) > 150, kinds  # both kinds of state, about half each
    assert set(shown) == {0, 1, 2}, shown  # 0 .. max_calls - 1 misses before the hit


def test_deterministic_and_checked():
    a = CalculatorCountdownDemonstrations(size=50, seed=7).records()
    assert [r.data for r in a] == [r.data for r in CalculatorCountdownDemonstrations(size=50, seed=7).records()]
    assert [r.data for r in a] != [r.data for r in CalculatorCountdownDemonstrations(size=50, seed=8).records()]
    one = CalculatorCountdownDemonstrations(size=100, max_calls=1, seed=0).records()
    assert all(r.data["prompt"].count("<tool_call>") <= 1 for r in one)  # at most the hit before the answer
    with pytest.raises(ValueError, match="max_calls must be >= 1"):
        CalculatorCountdownDemonstrations(max_calls=0)


def test_tool_call_text_is_what_the_parser_reads():
    text = tool_call_text("calculator", {"expression": "2*(3+4)"})
    (call,), errors = parse_tool_calls(text)
    assert not errors and call.name == "calculator" and call.arguments == {"expression": "2*(3+4)"}
    assert json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>"))["name"] == "calculator"
