"""The rollout worker: a rendered request in, scored :class:`~lit_rlft.core.types.Rollouts` out. No Lightning, no
collectives.

It owns the two things a rollout needs besides data: the engine (chosen in YAML, HF by default) and the scorer. A
:class:`~lit_rlft.rollout.source.RolloutRequest` carries the prompts already rendered (token ids, texts, reward
columns: :meth:`RolloutRequest.render <lit_rlft.rollout.source.RolloutRequest.render>` reads them from a prompt
source such as the datamodule). What the worker returns carries everything the step needs downstream as fields:
generation time, per-function rewards, the engine's own log-probs, and the episodes' sums.

Notation: ``B`` prompts, ``G`` completions per prompt, ``N = B * G``, ``P`` prompt length, ``L`` completion length.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
import torch

from lit_rlft.core.types import Rollouts, left_pad
from lit_rlft.rewards.scorer import Scorer, as_scorer
from lit_rlft.rollout.engines.base import GenerationOutput, RolloutEngine, SamplingConfig
from lit_rlft.rollout.episodes import EpisodeRunner
from lit_rlft.rollout.source import RolloutReply, RolloutRequest

Split = Literal["train", "val"]

#: Set to True on an exception raised by the engine's ``generate`` inside :meth:`RolloutWorker.rollout` (the
#: exception itself, type and message unchanged, is re-raised): a failure while generating, when the other ranks of a
#: sharded policy may be inside the forward passes' collectives. Read it with
#: :meth:`RolloutWorker.failed_in_generation`.
GENERATION_FAILED_ATTR = "lit_rlft_during_generation"


class RolloutWorker:
    """Generate ``G`` completions per prompt with an engine and score them with the reward functions.

    Args:
        engine: a :class:`~lit_rlft.rollout.engines.base.RolloutEngine` already ``setup`` with the policy.
        scorer: the :class:`~lit_rlft.rewards.scorer.Scorer` (a :class:`~lit_rlft.rewards.runner.RewardRunner`), or a
            plain ``(completions [N], columns) -> RewardResult`` callable (wrapped by ``as_scorer``).
        tokenizer: decodes completions for the reward functions.
        success_threshold: a completion is correct when its total reward is at least this.
        score_chunks: generate each call's prompts in this many chunks of whole groups, and score each chunk (in a
            thread) while the next one generates (1: one generate call, then scoring). Samples differ from one call's
            (the random stream is consumed chunk by chunk), so it is off by default.
        episodes: roll out multi-turn episodes with an environment
            (:class:`~lit_rlft.rollout.episodes.EpisodeRunner`); None: one completion per row. The reward functions
            then score each whole episode's text and receive the columns ``env_reward``, ``turns``, ``tool_calls``
            and ``tool_failures``; observation tokens are left out of the loss (``Rollouts.policy_mask``).
    """

    def __init__(self, engine: RolloutEngine, scorer: Scorer | Callable[..., Any], tokenizer: Any,
                 success_threshold: float = 1.0, score_chunks: int = 1, episodes: EpisodeRunner | None = None):
        if score_chunks < 1:
            raise ValueError(f"model.generation.score_chunks must be >= 1, got {score_chunks}")
        if score_chunks > 1 and episodes is not None:
            raise ValueError("model.generation.score_chunks > 1 does not apply to multi-turn episodes "
                             "(model.environment): set it to 1")
        self.episodes = episodes
        self.engine = engine
        self.scorer = scorer  # through the setter: a plain callable becomes a Scorer
        self.tokenizer = tokenizer
        self.success_threshold = success_threshold
        self.score_chunks = score_chunks
        self._scoring: ThreadPoolExecutor | None = None

    @property
    def scorer(self) -> Scorer:
        """The scorer."""
        return self._scorer

    @scorer.setter
    def scorer(self, scorer: Scorer | Callable[..., Any]) -> None:
        self._scorer = as_scorer(scorer)

    @staticmethod
    def failed_in_generation(exc: BaseException) -> bool:
        """Whether ``exc`` was raised by the engine's ``generate`` in :meth:`rollout` (rather than by scoring)."""
        return bool(getattr(exc, GENERATION_FAILED_ATTR, False))

    def rollout(self, request: RolloutRequest) -> RolloutReply:
        """Roll out ``request``'s ``B`` prompts, ``G`` completions each, and score every completion (``request.seed``:
        the engine call's seed, see :meth:`RolloutEngine.generate`; the rows' ``birth_step`` is ``request.version``).

        Returns the :class:`Rollouts`, the scorer's :class:`~lit_rlft.rewards.runner.RewardResult` (whose failure
        counts the step gathers) and, for episodes, their sums. An exception raised by the engine's ``generate``
        propagates as it is, marked (:meth:`failed_in_generation` is True for it)."""
        G, seed, sampling = request.num_generations, request.seed, request.sampling
        ids = np.asarray(request.prompt_ids, dtype=np.int64)
        prompts = request.prompt_tokens
        raw_columns = request.columns
        columns = {k: [v for v in vals for _ in range(G)] for k, vals in raw_columns.items()}
        episode_stats: dict[str, float] = {}
        if self.episodes is not None:
            rows = [{k: vals[b] for k, vals in raw_columns.items()} for b in range(len(ids))]
            t0 = time.perf_counter()
            try:
                episodes = self.episodes.run(self.engine, prompts, rows, G, sampling, seed)
            except Exception as exc:
                setattr(exc, GENERATION_FAILED_ATTR, True)
                raise
            seconds = time.perf_counter() - t0
            out = episodes.output
            columns.update(env_reward=episodes.env_rewards, turns=episodes.turns, tool_calls=episodes.tool_calls,
                           tool_failures=episodes.tool_failures)
            texts, scored = self._score(out, columns, G)
            episode_stats = episodes.stats()
        elif self.score_chunks > 1 and len(ids) > 1:
            out, texts, scored, seconds = self._chunked(prompts, columns, G, sampling, seed)
        else:
            t0 = time.perf_counter()
            out = self._generate(prompts, G, sampling, seed)
            seconds = time.perf_counter() - t0
            texts, scored = self._score(out, columns, G)
        rewards = scored.total.view(len(ids), G)  # [B, G]
        p_tok, p_mask = left_pad(prompts, self.tokenizer.pad_token_id)  # [B, P] each
        rollouts = Rollouts(
            prompt_ids=torch.as_tensor(ids),
            prompt_tokens=p_tok.repeat_interleave(G, dim=0),  # [N, P]
            prompt_mask=p_mask.repeat_interleave(G, dim=0),  # [N, P]
            completion_tokens=out.completion_ids,  # [N, L]
            completion_mask=out.completion_mask,  # [N, L]
            rewards=rewards,
            correct=rewards >= self.success_threshold,
            birth_step=_birth_steps(out, len(ids), G, request.version),
            is_replay=torch.zeros(len(ids), dtype=torch.bool),
            truncated=torch.tensor([r == "length" for r in out.finish_reasons]),
            engine_logprobs=out.logprobs,
            reward_per_func={k: v.float().view(len(ids), G) for k, v in scored.per_func.items()},
            completions=texts,
            prompts=list(request.prompt_texts),
            pad_id=self.tokenizer.pad_token_id,
            generation_s=seconds,
            policy_mask=None if out.policy_mask is None or torch.equal(out.policy_mask, out.completion_mask)
            else out.policy_mask,
        )
        return RolloutReply(rollouts, scored, episode_stats)

    def _generate(self, prompts: list[list[int]], G: int, sampling: SamplingConfig, seed: int | None) -> Any:
        try:
            return self.engine.generate(prompts, G, sampling, seed=seed)
        except Exception as exc:
            setattr(exc, GENERATION_FAILED_ATTR, True)  # every exception has a __dict__ (BaseException's)
            raise

    def _score(self, out: Any, columns: dict[str, list[Any]], G: int) -> tuple[list[str], Any]:
        """Decode ``out``'s completions and score them (``columns`` aligned with its rows)."""
        texts = self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
        columns = dict(columns)
        # tokens of each completion, for length-aware rewards (DAPO's soft overlong punishment)
        policy = out.completion_mask if out.policy_mask is None else out.policy_mask
        columns.setdefault("completion_length", policy.sum(-1).tolist())  # the policy's tokens
        if self.scorer.scores_batches:  # reward models, judges, remote scorers: token ids, whole groups
            lengths = out.completion_mask.sum(-1).tolist()
            columns["completion_ids"] = [row[:n] for row, n in zip(out.completion_ids.tolist(), lengths)]
            return texts, self.scorer(texts, columns, group_size=G)
        return texts, self.scorer(texts, columns)

    def _chunked(self, prompts: list[list[int]], columns: dict[str, list[Any]], G: int, sampling: SamplingConfig,
                 seed: int | None) -> tuple[Any, list[str], Any, float]:
        """Generate in ``score_chunks`` chunks of whole groups; each chunk is scored in a thread while the next one
        generates. Returns the joined output, texts, scores and the seconds spent generating."""
        if self.engine.synced:
            raise ValueError("model.generation.score_chunks > 1 needs an unsharded policy: under FSDP every rank "
                             "must make the same generate calls (set it to 1)")
        if self.scorer.uses_global_rng:
            raise ValueError("model.generation.score_chunks > 1 cannot score with a reward that samples from torch's "
                             "global generator (an EngineJudge) while the policy generates: set it to 1")
        if self._scoring is None:
            self._scoring = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lit_rlft-scoring")
        chunks = [rows for rows in np.array_split(np.arange(len(prompts)), min(self.score_chunks, len(prompts)))]
        outs, futures, seconds = [], [], 0.0
        for c, rows in enumerate(chunks):
            chunk_seed = None if seed is None else int(np.random.SeedSequence([seed, c]).generate_state(1, np.uint64)[0]) % 2**62
            t0 = time.perf_counter()
            out = self._generate([prompts[i] for i in rows], G, sampling, chunk_seed)
            seconds += time.perf_counter() - t0
            part = {k: v[rows[0] * G:(rows[-1] + 1) * G] for k, v in columns.items()}
            futures.append(self._scoring.submit(self._score, out, part, G))
            outs.append(out)
        parts = [f.result() for f in futures]
        texts = [t for part_texts, _ in parts for t in part_texts]
        return join_outputs(outs, self.tokenizer.pad_token_id), texts, join_results([p[1] for p in parts]), seconds

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_scoring"] = None
        return state


def _birth_steps(out: GenerationOutput, B: int, G: int, version: int) -> torch.Tensor:
    """``[B]`` each group's weights version: ``version`` (the trainer's, for engines on its own policy), or the oldest
    version the engine reports among the group's rows (servers: each row's own)."""
    if out.versions is None:
        return torch.full((B,), version, dtype=torch.long)
    return torch.tensor(out.versions, dtype=torch.long).view(B, G).min(dim=1).values


def join_outputs(outs: list[GenerationOutput], pad_id: int) -> GenerationOutput:
    """Generation outputs of consecutive prompt chunks as one (completions right-padded to the longest)."""
    width = max(o.completion_ids.shape[1] for o in outs)

    def pad(t: torch.Tensor, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    logprobs = None if any(o.logprobs is None for o in outs) else torch.cat([pad(o.logprobs, 0.0) for o in outs])
    versions = None if any(o.versions is None for o in outs) else [v for o in outs for v in o.versions]
    return GenerationOutput(completion_ids=torch.cat([pad(o.completion_ids, pad_id) for o in outs]),
                            completion_mask=torch.cat([pad(o.completion_mask, 0) for o in outs]), logprobs=logprobs,
                            finish_reasons=[r for o in outs for r in o.finish_reasons], versions=versions)


def join_results(results: list[Any]) -> Any:
    """Reward results of consecutive chunks as one (a :class:`~lit_rlft.rewards.runner.RewardResult`)."""
    if len(results) == 1:
        return results[0]
    from lit_rlft.rewards.runner import RewardResult

    joined = RewardResult(total=torch.cat([r.total for r in results]),
                          per_func={k: torch.cat([r.per_func[k] for r in results]) for k in results[0].per_func})
    for r in results:
        for counter in ("num_errors", "num_timeouts", "num_unscored"):
            setattr(joined, counter, getattr(joined, counter) + getattr(r, counter))
        for name, counts in r.failures.items():
            mine = joined.failures.setdefault(name, {})
            for kind, n in counts.items():
                mine[kind] = mine.get(kind, 0) + n
        for name, example in r.examples.items():
            joined.examples.setdefault(name, example)
    return joined
