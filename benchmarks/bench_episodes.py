"""Multi-turn episodes against single-turn rollouts of the same token count: episodes per second and where the time
goes (generation calls, environment steps); with vLLM, episodes with its prefix cache on and off.

    .venv/bin/python -m benchmarks.bench_episodes                      # the tiny policy, HF engine, 1 thread
    .venv/bin/python -m benchmarks.bench_episodes --turns 4 --turn-tokens 16 --prompts 16 --repeats 3
    .venv-vllm/bin/python -m benchmarks.bench_episodes --engine vllm --model smollm2-135m-instruct --tools

Writes ``benchmarks/results/episodes_<model>[_vllm][_tools].json`` and prints a table.

- Episodes: ``prompts x G`` episodes of ``--turns`` turns of at most ``--turn-tokens`` tokens each; the environment
  answers every turn with a short observation (``"ok"``, as a user message) and never ends an episode, so each runs
  ``--turns`` turns.
- Single turn: the same prompts, ``G`` completions each of at most ``turns x turn_tokens + observation tokens``
  tokens, one engine call: the tokens an episode holds, generated in one go.
- ``--engine vllm``: the episodes run twice per repeat, on two vLLM engines of the same weights, one with prefix
  caching (``VLLMEngine(enable_prefix_caching=True)``, vLLM's default) and one without.
- ``--tools``: every prompt carries a calculator tool's schema and Hermes' tool instructions (the system message of
  a tool-calling run, a few hundred tokens that every turn re-sends), rendered by the chat template when the model
  has one.
- All arms alternate ``--repeats`` times in one process (the machine is shared): medians, and the ratio of each
  repeat's pair. The token counts actually generated are reported beside (an untrained policy sometimes stops early).

- ``--update``: the last repeat's episodes (random 0/1 rewards, so every group has a gradient) go through one
  update of the policy with per-row passes and with shared-prompt passes (``model.optim.shared_prompt``), alternated
  ``--repeats`` times: each group's first prompt (with ``--tools``, the tool schema and instructions) computed once
  instead of ``G`` times; the observations stay out of the loss in both. The gradients are compared as well. TRL is
  not beside here: its ``GRPOTrainer`` has no environment loop of this shape to compare at equal settings.

An episode costs ``turns`` engine calls, each re-reading its whole context (the HF engine has no prefix cache across
calls; vLLM's prefix caching reuses it), plus one round trip to the environment's workers per turn.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from lit_rlft.envs.base import Environment, EnvStep
from lit_rlft.records.jsonio import write_result

RESULTS = Path(__file__).resolve().parent / "results"


def _setup(model_name: str, engine_name: str) -> tuple[Any, dict[str, Any]]:
    """The tokenizer and the engines: ``{"episodes": engine}`` (HF), or vLLM with its prefix cache on
    (``"episodes"``) and off (``"episodes_no_prefix_cache"``). The first also makes the single-turn rollouts."""
    from lit_rlft.models.loading import build_policy, load_tokenizer_for

    tok = load_tokenizer_for(model_name)
    policy, _ = build_policy(model_name, "float32", None, None, reference=False)
    policy.eval()
    if engine_name == "hf":
        from lit_rlft.rollout.engines.hf import HFEngine

        return tok, {"episodes": HFEngine.bound(policy, tok)}
    from lit_rlft.rollout.engines.vllm import VLLMEngine

    engines = {"episodes": VLLMEngine(dtype="float32", enable_prefix_caching=True, max_model_len=1024),
               "episodes_no_prefix_cache": VLLMEngine(dtype="float32", enable_prefix_caching=False,
                                                      max_model_len=1024)}
    for engine in engines.values():
        engine.setup(policy, tok)
    return tok, engines


def _prompts(tok: Any, prompts: int, tools: bool) -> list[list[int]]:
    """Countdown prompts, tokenised; with ``tools``, carrying the calculator's schema and the tool instructions."""
    from lit_rlft.data import CountdownTask
    from lit_rlft.data.templates import render_prompt, tools_system_prompt
    from lit_rlft.envs.tools import calculator, function_schema

    texts = [r.data["prompt"] for r in CountdownTask(size=prompts, num_numbers=[3, 4], seed=0).records()]
    if tools:
        schemas = [function_schema(calculator)]
        if getattr(tok, "chat_template", None):
            texts = [render_prompt(t, tok, chat_template=True, tools=schemas) for t in texts]
        else:
            texts = [render_prompt(t, system_prompt=tools_system_prompt(schemas)) for t in texts]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


class Ok(Environment):
    """Answers every turn with ``ok`` and never ends an episode."""

    name = "ok"

    def step(self, messages, row):
        return EnvStep(observation=[{"role": "user", "content": "ok"}])


def run(model_name: str, prompts: int, G: int, turns: int, turn_tokens: int, repeats: int, engine_name: str = "hf",
        tools: bool = False, update: bool = False) -> dict:
    from lit_rlft.envs.formats import observation_format
    from lit_rlft.rollout.engines.base import SamplingConfig
    from lit_rlft.rollout.episodes import EpisodeRunner

    tok, engines = _setup(model_name, engine_name)
    fmt = observation_format("auto", tok)
    obs_tokens = len(fmt.tokens([{"role": "user", "content": "ok"}]))
    budget = turns * turn_tokens + (turns - 1) * obs_tokens
    ids = _prompts(tok, prompts, tools)
    runner = EpisodeRunner(Ok(), tok, fmt, max_turns=turns, max_tokens=budget, timeout_s=30.0, num_workers=1)
    rows = [{} for _ in ids]
    rec: dict[str, list[float]] = {"single_s": [], "single_tokens": []}
    for arm in engines:
        for key in ("s", "ratio", "tokens", "policy_tokens", "env_s"):
            rec[f"{arm}_{key}"] = []
    step = runner.pool.run
    env_time = [0.0]

    def timed_run(tasks):
        t0 = time.perf_counter()
        out = step(tasks)
        env_time[0] += time.perf_counter() - t0
        return out

    runner.pool.run = timed_run
    sampling = SamplingConfig(max_new_tokens=turn_tokens)
    first = next(iter(engines.values()))
    try:
        for engine in engines.values():
            runner.run(engine, ids[:2], rows[:2], 1, sampling, seed=0)  # warm-up
        for r in range(repeats):
            torch.manual_seed(r)
            t0 = time.perf_counter()
            single = first.generate(ids, G, SamplingConfig(max_new_tokens=budget), seed=r)
            rec["single_s"].append(time.perf_counter() - t0)
            rec["single_tokens"].append(float(single.completion_mask.sum()))
            for arm, engine in engines.items():
                torch.manual_seed(r)
                env_time[0] = 0.0
                t0 = time.perf_counter()
                ep = runner.run(engine, ids, rows, G, sampling, seed=r)
                e_s = time.perf_counter() - t0
                rec[f"{arm}_s"].append(e_s)
                rec[f"{arm}_ratio"].append(e_s / rec["single_s"][-1])
                rec[f"{arm}_tokens"].append(float(ep.output.completion_mask.sum()))
                rec[f"{arm}_policy_tokens"].append(float(ep.output.policy_mask.sum()))
                rec[f"{arm}_env_s"].append(env_time[0])
    finally:
        runner.close()
    n = prompts * G
    updates = update_times(model_name, ep, ids, G, tok.pad_token_id, repeats) if update else None
    med = {k: statistics.median(v) for k, v in rec.items()}
    out = {"episodes": n, "turns": turns, "turn_tokens": turn_tokens, "observation_tokens": obs_tokens,
           "episode_budget_tokens": budget, "engine": engine_name, "tools": tools, "arms": list(engines),
           "prompt_tokens_mean": sum(map(len, ids)) / len(ids), "per_repeat": rec, "median": med,
           "single_turn_per_s": n / med["single_s"], "single_tokens_per_s": med["single_tokens"] / med["single_s"]}
    for arm in engines:
        out[f"{arm}_per_s"] = n / med[f"{arm}_s"]
        out[f"{arm}_tokens_per_s"] = med[f"{arm}_tokens"] / med[f"{arm}_s"]
        out[f"{arm}_env_share"] = med[f"{arm}_env_s"] / med[f"{arm}_s"]
    if len(engines) == 2:  # prefix cache on against off, per repeat
        on, off = rec["episodes_s"], rec["episodes_no_prefix_cache_s"]
        out["prefix_cache_speedup"] = statistics.median(b / a for a, b in zip(on, off))
    if updates is not None:
        out["update"] = updates
    return out


def update_times(model_name: str, episodes: Any, prompts: list[list[int]], G: int, pad_id: int,
                 repeats: int) -> dict[str, Any]:
    """One update over ``episodes`` per-row and shared-prompt, alternated ``repeats`` times: medians, their ratio,
    and the largest relative difference between the two gradients."""
    from lit_rlft.core.losses import GRPOLoss
    from lit_rlft.core.types import Rollouts, left_pad
    from lit_rlft.models.loading import build_policy
    from lit_rlft.step import TorchBackend
    from lit_rlft.step.update import PolicyUpdater

    out = episodes.output
    B = len(prompts)
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (B, G), generator=gen).float()
    p_tok, p_mask = left_pad(prompts, pad_id)
    rollouts = Rollouts(
        prompt_ids=torch.arange(B), prompt_tokens=p_tok.repeat_interleave(G, 0), prompt_mask=p_mask.repeat_interleave(G, 0),
        completion_tokens=out.completion_ids, completion_mask=out.completion_mask, rewards=rewards,
        correct=rewards >= 1, birth_step=torch.zeros(B, dtype=torch.long), is_replay=torch.zeros(B, dtype=torch.bool),
        truncated=torch.zeros(B * G, dtype=torch.bool), policy_mask=out.policy_mask, pad_id=pad_id)
    advantages = (rewards - rewards.mean(1, keepdim=True)).flatten()
    policy, _ = build_policy(model_name, "float32", None, None, reference=False)
    policy.train()
    grads: dict[bool, dict[str, torch.Tensor]] = {}

    class Capture(torch.optim.SGD):  # keeps the gradient, leaves the weights: every update sees the same policy
        def step(self, closure=None):
            grads[self.shared] = {n: p.grad.detach().clone() for n, p in policy.named_parameters()
                                  if p.grad is not None}

    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for shared in (False, True):
            optimizer = Capture(policy.parameters(), lr=0.0)
            optimizer.shared = shared
            updater = PolicyUpdater(GRPOLoss(loss_type="dapo"), 1.0, shared_prompt=shared)
            t0 = time.perf_counter()
            updater.update(rollouts, advantages, TorchBackend(policy, optimizer))
            times[shared].append(time.perf_counter() - t0)
    worst = max(float((grads[True][n] - g).norm() / g.norm().clamp_min(1e-12)) for n, g in grads[False].items())
    return {"per_row_s": statistics.median(times[False]), "shared_s": statistics.median(times[True]),
            "ratio": statistics.median(b / a for a, b in zip(times[False], times[True])),
            "per_repeat": {"per_row_s": times[False], "shared_s": times[True]},
            "largest_relative_gradient_difference": worst,
            "sequence_tokens_mean": float(out.completion_mask.sum(1).float().mean())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    p.add_argument("--tools", action="store_true", help="prompts carry a calculator's schema and tool instructions")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--turn-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--update", action="store_true", help="also time one update, per-row and shared-prompt passes")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    out = run(a.model, a.prompts, a.generations, a.turns, a.turn_tokens, a.repeats, a.engine, a.tools, a.update)
    out.update(model=a.model, threads=a.threads,
               command=" ".join(["python -m benchmarks.bench_episodes", *sys.argv[1:]]))
    m = out["median"]
    print(f"{out['episodes']} episodes of {a.turns} turns x {a.turn_tokens} tokens ({out['observation_tokens']} "
          f"observation tokens between turns), prompts of {out['prompt_tokens_mean']:.0f} tokens, {a.model}, "
          f"{a.engine} engine, {a.threads} thread(s), {a.repeats} repeats:")
    print("| rollout | median s | per s | tokens (median) | tokens/s | time / single turn (per repeat) |")
    print("|---|---|---|---|---|---|")
    for arm in out["arms"]:
        ratios = out["per_repeat"][f"{arm}_ratio"]
        label = {"episodes": f"episodes ({a.turns} engine calls)",
                 "episodes_no_prefix_cache": "episodes, vLLM prefix cache off"}[arm]
        print(f"| {label} | {m[f'{arm}_s']:.2f} | {out[f'{arm}_per_s']:.1f} | {m[f'{arm}_tokens']:.0f} "
              f"({m[f'{arm}_policy_tokens']:.0f} policy) | {out[f'{arm}_tokens_per_s']:.0f} | "
              f"{statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)}) |")
    print(f"| single turn, same budget | {m['single_s']:.2f} | {out['single_turn_per_s']:.1f} | "
          f"{m['single_tokens']:.0f} | {out['single_tokens_per_s']:.0f} | 1 |")
    print(f"environment steps {100 * out['episodes_env_share']:.1f}% of the episodes' time")
    if "prefix_cache_speedup" in out:
        print(f"prefix cache on: episodes {out['prefix_cache_speedup']:.2f}x faster than off (median of the repeats' "
              "ratios)")
    name = "tiny" if a.model == "tiny" else Path(a.model).name
    name += "_vllm" if a.engine == "vllm" else ""
    name += "_tools" if a.tools else ""
    if "update" in out:
        u = out["update"]
        print(f"one update over the episodes: per-row {u['per_row_s']:.2f} s, shared-prompt {u['shared_s']:.2f} s "
              f"({u['ratio']:.2f}x, median of the repeats' ratios); largest relative gradient difference "
              f"{u['largest_relative_gradient_difference']:.1e}")
    path = write_result(RESULTS / f"episodes_{name}.json", out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
