"""Multi-turn rollouts: the engine takes the policy's turns, an environment answers them, until each episode ends.

Notation: ``B`` prompts, ``G`` episodes per prompt, ``N = B * G``, ``L`` the longest episode after its prompt.

An episode is ``prompt | turn 1 | observation 1 | turn 2 | ... | turn k``. Turn 1 of every episode is one engine call
exactly as a single-turn rollout makes it (``G`` samples per prompt, the call's seed): with ``max_turns=1`` the
completions are the single-turn ones, token for token. Each later turn is one batched call over the episodes still
going (one sample each, from ``prompt + episode so far``; engines that cache prefixes reuse them), seeded from
``(seed, turn)``. After every turn the environment's :meth:`~lit_rlft.envs.Environment.step` runs for every episode
that turn extended, in worker processes that are killed and replaced on a timeout (:mod:`lit_rlft.runtime.worker_pool`): a
step that raises or hangs gives that episode an error message and the episode goes on; nothing else is affected.

An episode ends when the environment says so, after ``max_turns`` turns, when its token budget is spent (``max_tokens``
tokens after the prompt, observations included), or when the next observation would not fit in the budget (the
observation is dropped, as TRL drops it). A turn cut by the per-turn limit (the sampling's ``max_new_tokens``) still
goes to the environment. ``finish_reason`` is "length" when the episode's last turn was cut, or the budget ended it
before an observation: the episode is then truncated (``mask_truncated_completions`` applies to it as a whole).

Under a sharded policy (FSDP, where every ``generate`` call is a collective) the ranks agree before each later turn
whether any of them still has an episode going (one all-reduce); a rank whose episodes have all ended makes a
throw-away one-token call meanwhile, so episodes may end at different turns on different ranks.

The output is a :class:`~lit_rlft.rollout.engines.base.GenerationOutput` over the whole episodes: ``completion_mask`` marks
every token after the prompt (the policy's and the observations'), ``policy_mask`` the policy's own (1) against the
observations (0), ``logprobs`` the engine's sampling log-probs on the policy's tokens (0 on observations).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from lit_rlft.envs.base import Environment, EnvStep, Message
from lit_rlft.envs.formats import ObservationFormat
from lit_rlft.rollout.engines.base import GenerationOutput, RolloutEngine, SamplingConfig
from lit_rlft.runtime.worker_pool import ERROR, OK, TIMEOUT, Job, JobResult, WorkerPool

__all__ = ["EpisodeOutput", "EpisodeRunner", "step_job"]

_MAX_ERROR = 300


def step_job(env: Environment, job: Job) -> JobResult:
    """Run one environment step in a worker: ``env.step(job.row["messages"], job.row["row"])``, its prints
    discarded (a tool's output reaches the policy through its return value, bounded by the environment)."""
    try:
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            out = env.step(job.row["messages"], job.row["row"])  # what it prints is no one's business
    except Exception as exc:  # untrusted code on untrusted text: this episode alone hears of it
        return JobResult(ERROR, f"{type(exc).__name__}: {str(exc)[:_MAX_ERROR]}")
    if not isinstance(out, EnvStep):
        return JobResult(ERROR, f"step returned {type(out).__name__}, expected an EnvStep")
    return JobResult(OK, out)


@dataclass
class EpisodeOutput:
    """The episodes of one call: the engine-shaped output plus what the environment said and counted.

    Attributes:
        output: ``completion_ids`` / ``completion_mask`` / ``logprobs`` ``[N, L]`` over the whole episodes, and
            ``policy_mask`` ``[N, L]``.
        env_rewards: ``[N]`` the environment's reward of each episode (None where it gave none).
        turns: ``[N]`` policy turns of each episode.
        tool_calls / tool_failures: ``[N]`` tool calls of each episode, and those that failed.
        env_errors / env_timeouts: environment steps that raised / ran past the bound (each told its episode).
        transcripts: ``[N]`` the messages of each episode (policy turns and observations, as text).
    """

    output: GenerationOutput
    env_rewards: list[float | None]
    turns: list[int]
    tool_calls: list[int]
    tool_failures: list[int]
    env_errors: int = 0
    env_timeouts: int = 0
    transcripts: list[list[Message]] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    """``[N]`` why each episode ended: ``"env"`` (the environment), ``"max_turns"``, ``"length"`` (the budget)."""

    def stats(self) -> dict[str, float]:
        """Sums over the episodes (what a rank sends to be logged as ``episodes/...``)."""
        mask, policy = self.output.completion_mask, self.output.policy_mask
        policy = mask if policy is None else policy
        return {"episodes": float(len(self.turns)), "turns": float(sum(self.turns)),
                "tool_calls": float(sum(self.tool_calls)), "tool_failures": float(sum(self.tool_failures)),
                "env_errors": float(self.env_errors), "env_timeouts": float(self.env_timeouts),
                "policy_tokens": float(policy.sum()), "observation_tokens": float((mask - policy).sum()),
                "ended_by_env": float(sum(1 for r in self.finish if r == "env")),
                "truncated": float(sum(1 for r in self.output.finish_reasons if r == "length"))}


@dataclass
class _Episode:
    tokens: list[int] = field(default_factory=list)
    policy: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    reward: float | None = None
    finish: str | None = None  # None while it goes on
    truncated: bool = False
    version: int | None = None  # the oldest weights version among its turns (engines that report one)


class EpisodeRunner:
    """Roll out multi-turn episodes with an engine and an environment.

    Args:
        env: the :class:`~lit_rlft.envs.Environment`.
        tokenizer: the policy's tokenizer (decodes turns for the environment).
        fmt: how observations become tokens (:func:`~lit_rlft.envs.formats.observation_format`).
        max_turns: policy turns per episode at most.
        max_tokens: tokens after the prompt per episode at most, observations included (TRL's
            ``max_completion_length`` over a whole tool-calling episode); None: the sampling's ``max_new_tokens``.
        timeout_s: bound on one environment step (a tool call and its result), in seconds.
        num_workers: environment worker processes (default: as the reward workers).
    """

    def __init__(self, env: Environment, tokenizer: Any, fmt: ObservationFormat, max_turns: int = 4,
                 max_tokens: int | None = None, timeout_s: float = 10.0, num_workers: int | None = None):
        if max_turns < 1:
            raise ValueError(f"model.episodes.max_turns must be >= 1, got {max_turns}")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"model.episodes.max_tokens must be >= 1, got {max_tokens}")
        self.env, self.tokenizer, self.fmt = env, tokenizer, fmt
        self.max_turns, self.max_tokens, self.timeout_s = max_turns, max_tokens, timeout_s
        self.pool = WorkerPool([env], timeout_s, num_workers, call=step_job, name="lit-rlft-env")

    def close(self) -> None:
        self.pool.close()

    def run(self, engine: RolloutEngine, prompts: Sequence[list[int]], rows: Sequence[dict[str, Any]], G: int,
            sampling: SamplingConfig, seed: int | None = None) -> EpisodeOutput:
        """``G`` episodes of each of the ``B`` tokenised ``prompts`` (``rows``: each prompt's data-set columns)."""
        budget = self.max_tokens or sampling.max_new_tokens
        episodes = [_Episode() for _ in range(len(prompts) * G)]
        contexts = [list(p) for p in prompts for _ in range(G)]
        row_of = [rows[i // G] for i in range(len(episodes))]
        first = engine.generate(list(prompts), G, replace(sampling, max_new_tokens=min(sampling.max_new_tokens,
                                                                                        budget)), seed=seed)
        reported = self._append_turns(episodes, list(range(len(episodes))), first, budget)
        counts = {"errors": 0, "timeouts": 0}
        for turn in range(1, self.max_turns + 1):
            going = [e for e, ep in enumerate(episodes) if ep.finish is None]
            if going:
                self._environment(episodes, going, row_of, turn, budget, counts)
                going = [e for e in going if episodes[e].finish is None]
            if not engine.any_rank(bool(going)):  # a collective when the engine's calls are (a sharded policy)
                break
            if not going:  # sharded, and another rank's episodes go on: a throw-away call keeps the ranks in step
                engine.generate([list(prompts[0])], 1, replace(sampling, max_new_tokens=1))
                continue
            room = max(budget - len(episodes[e].tokens) for e in going)
            out = engine.generate([contexts[e] + episodes[e].tokens for e in going], 1,
                                  replace(sampling, max_new_tokens=min(sampling.max_new_tokens, room)),
                                  seed=None if seed is None else _turn_seed(seed, turn))
            reported = self._append_turns(episodes, going, out, budget) and reported
        return self._output(episodes, counts, first.completion_ids.shape[1], reported)

    # -- one turn ------------------------------------------------------------------------------------------
    def _append_turns(self, episodes: list[_Episode], which: list[int], out: GenerationOutput, budget: int) -> bool:
        """Append one turn to each episode of ``which``; whether the engine reported its sampling log-probs (an
        engine that reports none, HF, leaves pi_old to stand in for mu)."""
        lengths = out.completion_mask.sum(1).tolist()
        ids = out.completion_ids.tolist()
        lps = out.logprobs.tolist() if out.logprobs is not None else None
        for k, e in enumerate(which):
            ep = episodes[e]
            n = min(int(lengths[k]), budget - len(ep.tokens))
            turn = ids[k][:n]
            ep.tokens += turn
            ep.policy += [1] * n
            ep.logprobs += lps[k][:n] if lps is not None else [0.0] * n
            ep.turns += 1
            if out.versions is not None:
                ep.version = out.versions[k] if ep.version is None else min(ep.version, out.versions[k])
            ep.messages.append({"role": "assistant", "content": self.tokenizer.decode(turn, skip_special_tokens=True)})
            # a turn cut by the per-turn limit goes to the environment like any other (a cut tool call is its to
            # refuse); the episode's budget spent ends the episode
            ep.truncated = n < int(lengths[k]) or out.finish_reasons[k] == "length"  # the last turn's, at the end
            if len(ep.tokens) >= budget:
                ep.finish = "length"
        return lps is not None

    def _environment(self, episodes: list[_Episode], going: list[int], row_of: list[dict[str, Any]], turn: int,
                     budget: int, counts: dict[str, int]) -> None:
        jobs = [Job(0, episodes[e].messages[-1]["content"],
                    {"messages": [dict(m) for m in episodes[e].messages], "row": row_of[e]}) for e in going]
        results = self.pool.run(jobs)
        for e, res in zip(going, results):
            ep = episodes[e]
            step = self._as_step(res, counts)
            ep.tool_calls += step.tool_calls
            ep.tool_failures += step.tool_failures
            if step.reward is not None:
                ep.reward = float(step.reward)
            if step.done:
                ep.finish = "env"
                continue
            if turn >= self.max_turns:
                ep.finish = "max_turns"
                continue
            obs = self.fmt.tokens(step.observation)
            if len(ep.tokens) + len(obs) >= budget:  # no room for the observation and a turn after it
                ep.finish, ep.truncated = "length", True  # cut short: not the policy's decision to stop here
                continue
            ep.tokens += obs
            ep.policy += [0] * len(obs)
            ep.logprobs += [0.0] * len(obs)
            ep.messages += [dict(m) for m in step.observation]

    def _as_step(self, res: JobResult, counts: dict[str, int]) -> EnvStep:
        """The environment's answer, or an error message for the policy when the step failed."""
        if res.outcome == OK:
            return res.value
        if res.outcome == TIMEOUT:
            counts["timeouts"] += 1
            text = f"error: the {self.env.name} did not answer within {self.timeout_s:g} s"
        else:
            counts["errors"] += 1
            text = f"error: {res.value}"
        return EnvStep(observation=[{"role": "tool", "name": self.env.name, "content": text}], tool_calls=1,
                       tool_failures=1)

    # -- the batch -----------------------------------------------------------------------------------------
    def _output(self, episodes: list[_Episode], counts: dict[str, int], first_width: int,
                reported: bool) -> EpisodeOutput:
        pad = self.tokenizer.pad_token_id
        width = max(first_width, 1, max(len(ep.tokens) for ep in episodes))  # one turn: the first call's layout
        N = len(episodes)
        ids = torch.full((N, width), pad, dtype=torch.long)
        mask = torch.zeros((N, width), dtype=torch.long)
        policy = torch.zeros((N, width), dtype=torch.long)
        logprobs = torch.zeros((N, width), dtype=torch.float32)
        for i, ep in enumerate(episodes):
            n = len(ep.tokens)
            ids[i, :n] = torch.tensor(ep.tokens, dtype=torch.long)
            mask[i, :n] = 1
            policy[i, :n] = torch.tensor(ep.policy, dtype=torch.long)
            logprobs[i, :n] = torch.tensor(ep.logprobs, dtype=torch.float32)
        out = GenerationOutput(completion_ids=ids, completion_mask=mask, logprobs=logprobs if reported else None,
                               finish_reasons=["length" if ep.truncated else "stop" for ep in episodes],
                               policy_mask=policy, versions=None if any(ep.version is None for ep in episodes)
                               else [ep.version for ep in episodes])
        return EpisodeOutput(output=out, env_rewards=[ep.reward for ep in episodes],
                             turns=[ep.turns for ep in episodes], tool_calls=[ep.tool_calls for ep in episodes],
                             tool_failures=[ep.tool_failures for ep in episodes], env_errors=counts["errors"],
                             env_timeouts=counts["timeouts"], transcripts=[ep.messages for ep in episodes],
                             finish=[ep.finish or "max_turns" for ep in episodes])


def _turn_seed(seed: int, turn: int) -> int:
    return int(np.random.SeedSequence([seed, 7919, turn]).generate_state(1, np.uint64)[0]) % 2**62

