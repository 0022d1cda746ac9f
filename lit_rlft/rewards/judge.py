"""An LLM judge as a reward: a prompt template, a judge that writes a judgement, a parser from its text to a score.

The judge is a separate model from the policy, reached one of two ways:

- :class:`OpenAIJudge`: any OpenAI-compatible ``/chat/completions`` endpoint (``vllm serve``, SGLang, a hosted API),
  requests in parallel under a concurrency limit, with a time bound and retries (prime-rl's and SkyRL's way);
- :class:`~lit_rlft.rollout.judge.EngineJudge`: a model generating through lit_rlft's own engines (HF by default, or
  vLLM), in this process (in ``lit_rlft.rollout``: it needs the engines, a layer above the rewards).

A judgement that fails (a timeout, an HTTP error) or that the parser cannot read scores 0 for that completion alone
and is counted (``rewards/num_errors``, ``num_timeouts``, ``num_unscored``), as rule failures are.

Example:
    >>> judge = JudgeReward(OpenAIJudge("http://localhost:8000/v1", model="Qwen/Qwen2.5-7B-Instruct"))  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from lit_rlft.rewards.batched import BatchedReward, Failure
from lit_rlft.rewards.http import HTTPClient, RequestFailed

__all__ = ["DEFAULT_TEMPLATE", "Judge", "JudgeReward", "OpenAIJudge", "ScoreParser"]

DEFAULT_TEMPLATE = (
    "Rate how well the response answers the question, from 0 (wrong or useless) to 10 (correct and complete).\n\n"
    "Question:\n{prompt}\n\nResponse:\n{completion}\n\nReply with one line: Score: N"
)
"""The default judge prompt; ``{prompt}``, ``{completion}`` and any data set column (``{answer}``) are filled in."""


class Judge(Protocol):
    """What writes judgements: one text (or a :class:`Failure`) per request."""

    def complete(self, requests: list[str]) -> list[str | Failure]: ...


class ScoreParser:
    """Read a score from a judgement: the last match of ``pattern``'s first group, divided by ``scale``.

    Args:
        pattern: a regular expression whose first group is the number (case-insensitive).
        scale: the score is ``number / scale`` (10 turns a 0-10 judgement into 0-1).
        low, high: numbers outside ``[low, high]`` (before scaling) are not scores (None: unparsable).

    Example:
        >>> ScoreParser()("The answer is right. Score: 8")
        0.8
        >>> ScoreParser()("I cannot judge this") is None
        True
    """

    def __init__(self, pattern: str = r"score\s*[:=]?\s*\**\s*(-?\d+(?:\.\d+)?)", scale: float = 10.0,
                 low: float | None = 0.0, high: float | None = 10.0) -> None:
        if scale == 0:
            raise ValueError("ScoreParser: scale must not be 0")
        self.regex = re.compile(pattern, re.IGNORECASE)
        if self.regex.groups < 1:
            raise ValueError(f"ScoreParser: pattern {pattern!r} needs a group around the number")
        self.scale, self.low, self.high = float(scale), low, high

    def __call__(self, text: str) -> float | None:
        matches = self.regex.findall(text)
        if not matches:
            return None
        last = matches[-1][0] if isinstance(matches[-1], tuple) else matches[-1]
        try:
            value = float(last)
        except ValueError:
            return None
        if not math.isfinite(value) or (self.low is not None and value < self.low) or (
                self.high is not None and value > self.high):
            return None
        return value / self.scale


class JudgeReward(BatchedReward):
    """Score each completion by a judge's reading of it.

    Args:
        judge: an :class:`OpenAIJudge`, a :class:`~lit_rlft.rollout.EngineJudge`, or anything with
            ``complete(requests)``.
        template: the judge's prompt; ``{prompt}``, ``{completion}`` and the data set's columns are filled in.
        parser: judgement text -> score or None (default :class:`ScoreParser`: ``Score: N`` out of 10 -> N / 10).
        name: the name in ``rewards/<name>/...``.
        cache: keep scores by (prompt, completion): right for a judge that answers the same text the same way
            (temperature 0); turn it off for a sampling judge whose every reading should count.
    """

    def __init__(self, judge: Judge, template: str = DEFAULT_TEMPLATE, parser: Any = None, *, name: str = "judge",
                 cache: bool = True) -> None:
        if not callable(getattr(judge, "complete", None)):
            raise ValueError(f"JudgeReward: the judge needs a complete(requests) method, got {type(judge).__name__}")
        if "{completion}" not in template:
            raise ValueError("JudgeReward: the template must contain {completion}")
        self.judge = judge
        self.template = template
        self.parser = parser if parser is not None else ScoreParser()
        self.name = name
        self.cacheable = bool(cache)
        self.last_judgements: list[str | Failure] = []

    def requests(self, completions: list[str], columns: Mapping[str, Sequence[Any]]) -> list[str]:
        """The judge's prompt for each completion."""
        rows = [{k: v[i] for k, v in columns.items() if isinstance(v, (list, tuple)) and k != "completion_ids"}
                for i in range(len(completions))]
        out = []
        for completion, row in zip(completions, rows):
            fields = {**row, "prompt": row.get("prompts", ""), "completion": completion}
            try:
                out.append(self.template.format(**fields))
            except KeyError as exc:
                raise ValueError(f"JudgeReward: the template names {{{exc.args[0]}}}, which is not a column "
                                 f"(columns: {sorted(fields)})") from None
        return out

    def score(self, completions: list[str], columns: Mapping[str, Sequence[Any]]) -> list[float | None | Failure]:
        judgements = self.judge.complete(self.requests(completions, columns))
        if len(judgements) != len(completions):
            raise ValueError(f"JudgeReward: the judge gave {len(judgements)} judgements for {len(completions)} "
                             "requests")
        self.last_judgements = list(judgements)
        out: list[float | None | Failure] = []
        for text in judgements:
            if isinstance(text, Failure):
                out.append(text)
                continue
            try:
                value = self.parser(text)
            except Exception as exc:  # a parser is user code: its failure is this judgement's alone
                out.append(Failure("unscored", f"parser raised {type(exc).__name__}: {str(exc)[:80]}"))
                continue
            out.append(value if value is not None else Failure("unscored", f"unparsable judgement {text[:60]!r}"))
        return out

    @property
    def uses_global_rng(self) -> bool:
        return bool(getattr(self.judge, "uses_global_rng", False))

    def close(self) -> None:
        close = getattr(self.judge, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return f"JudgeReward({self.judge!r}, name={self.name!r})"


class OpenAIJudge:
    """A judge behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: e.g. ``http://localhost:8000/v1`` (``vllm serve``).
        model: the model name the endpoint serves.
        api_key: sent as a bearer token (default: the ``api_key_env`` variable, when set).
        system_prompt: an optional system message before each request.
        max_tokens, temperature: the judgement's length bound and sampling temperature (0: greedy).
        timeout_s, retries, backoff_s, max_concurrency: see :class:`~lit_rlft.rewards.http.HTTPClient`.
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 system_prompt: str | None = None, max_tokens: int = 256, temperature: float = 0.0,
                 timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5, max_concurrency: int = 8) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"OpenAIJudge: base_url must start with http:// or https://, got {base_url!r}")
        key = api_key if api_key is not None else os.environ.get(api_key_env)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.system_prompt = system_prompt
        self.max_tokens = int(max_tokens)
        self.temperature = float(temperature)
        self.client = HTTPClient(timeout_s, retries, backoff_s, max_concurrency,
                                 {"Authorization": f"Bearer {key}"} if key else None)

    def _one(self, request: str) -> str | Failure:
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + [
            {"role": "user", "content": request}]
        try:
            answer = self.client.post(self.url, {"model": self.model, "messages": messages,
                                                 "max_tokens": self.max_tokens, "temperature": self.temperature})
        except RequestFailed as exc:
            return exc.failure
        try:
            content = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            return Failure("unscored", f"{self.url} answered without choices[0].message.content: {str(answer)[:60]}")
        return content if isinstance(content, str) else Failure("unscored", f"{self.url} gave non-text content")

    def complete(self, requests: list[str]) -> list[str | Failure]:
        return self.client.map(self._one, requests)

    def close(self) -> None:
        self.client.close()

    def __repr__(self) -> str:
        return f"OpenAIJudge({self.url!r}, model={self.model!r})"
