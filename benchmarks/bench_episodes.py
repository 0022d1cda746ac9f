"""Multi-turn episodes against single-turn rollouts of the same token count: episodes per second and where the time
goes (generation calls, environment steps).

    .venv/bin/python -m benchmarks.bench_episodes                      # the tiny policy, HF engine, 1 thread
    .venv/bin/python -m benchmarks.bench_episodes --turns 4 --turn-tokens 16 --prompts 16 --repeats 3

Writes ``benchmarks/results/episodes_<model>.json`` and prints a table.

- Episodes: ``prompts x G`` episodes of ``--turns`` turns of at most ``--turn-tokens`` tokens each; the environment
  answers every turn with a short observation (``"ok"``) and never ends an episode, so each runs ``--turns`` turns.
- Single turn: the same prompts, ``G`` completions each of at most ``turns x turn_tokens + observation tokens``
  tokens, one engine call: the tokens an episode holds, generated in one go.
- Both alternate ``--repeats`` times in one process (the machine is shared): medians, and the ratio of each repeat's
  pair. The token counts actually generated are reported beside (an untrained policy sometimes stops early).

An episode costs ``turns`` engine calls, each re-reading its whole context (the HF engine has no prefix cache across
calls; vLLM's prefix caching reuses it), plus one round trip to the environment's workers per turn.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from lit_rlft.envs.base import Environment, EnvStep

RESULTS = Path(__file__).resolve().parent / "results"


def _setup(model_name: str):
    from lit_rlft.models.loading import build_policy, load_tokenizer_for
    from lit_rlft.rollout.hf import HFEngine

    tok = load_tokenizer_for(model_name)
    policy, _ = build_policy(model_name, "float32", None, None, reference=False)
    policy.eval()
    engine = HFEngine()
    engine.setup(policy, tok)
    return tok, engine


class Ok(Environment):
    """Answers every turn with ``ok`` and never ends an episode."""

    name = "ok"

    def step(self, messages, row):
        return EnvStep(observation=[{"role": "user", "content": "ok"}])


def run(model_name: str, prompts: int, G: int, turns: int, turn_tokens: int, repeats: int) -> dict:
    from lit_rlft.data import CountdownTask
    from lit_rlft.envs.formats import TextFormat
    from lit_rlft.rollout.base import SamplingConfig
    from lit_rlft.rollout.episodes import EpisodeRunner

    tok, engine = _setup(model_name)
    fmt = TextFormat(tok)
    obs_tokens = len(fmt.tokens([{"role": "user", "content": "ok"}]))
    budget = turns * turn_tokens + (turns - 1) * obs_tokens
    texts = [r.data["prompt"] for r in CountdownTask(size=prompts, num_numbers=[3, 4], seed=0).records()]
    ids = [tok(t)["input_ids"] for t in texts]
    runner = EpisodeRunner(Ok(), tok, fmt, max_turns=turns, max_tokens=budget, timeout_s=30.0, num_workers=1)
    rows = [{} for _ in ids]
    rec: dict[str, list[float]] = {"episode_s": [], "single_s": [], "ratio": [], "episode_tokens": [],
                                   "single_tokens": [], "episode_policy_tokens": [], "env_s": []}
    step = runner.pool.run
    env_time = [0.0]

    def timed_run(tasks):
        t0 = time.perf_counter()
        out = step(tasks)
        env_time[0] += time.perf_counter() - t0
        return out

    runner.pool.run = timed_run
    try:
        runner.run(engine, ids[:2], rows[:2], 1, SamplingConfig(max_new_tokens=turn_tokens), seed=0)  # warm-up
        for r in range(repeats):
            torch.manual_seed(r)
            env_time[0] = 0.0
            t0 = time.perf_counter()
            ep = runner.run(engine, ids, rows, G, SamplingConfig(max_new_tokens=turn_tokens), seed=r)
            e_s = time.perf_counter() - t0
            torch.manual_seed(r)
            t0 = time.perf_counter()
            single = engine.generate(ids, G, SamplingConfig(max_new_tokens=budget), seed=r)
            s_s = time.perf_counter() - t0
            rec["episode_s"].append(e_s)
            rec["single_s"].append(s_s)
            rec["ratio"].append(e_s / s_s)
            rec["episode_tokens"].append(float(ep.output.completion_mask.sum()))
            rec["episode_policy_tokens"].append(float(ep.output.policy_mask.sum()))
            rec["single_tokens"].append(float(single.completion_mask.sum()))
            rec["env_s"].append(env_time[0])
    finally:
        runner.close()
    n = prompts * G
    med = {k: statistics.median(v) for k, v in rec.items()}
    return {"episodes": n, "turns": turns, "turn_tokens": turn_tokens, "observation_tokens": obs_tokens,
            "episode_budget_tokens": budget, "per_repeat": rec, "median": med,
            "episodes_per_s": n / med["episode_s"], "single_turn_per_s": n / med["single_s"],
            "episode_tokens_per_s": med["episode_tokens"] / med["episode_s"],
            "single_tokens_per_s": med["single_tokens"] / med["single_s"],
            "env_share": med["env_s"] / med["episode_s"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--turn-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    out = run(a.model, a.prompts, a.generations, a.turns, a.turn_tokens, a.repeats)
    out.update(model=a.model, threads=a.threads, machine=platform.processor() or platform.machine(),
               torch=torch.__version__, command=" ".join(["python -m benchmarks.bench_episodes", *sys.argv[1:]]))
    m = out["median"]
    print(f"{out['episodes']} episodes of {a.turns} turns x {a.turn_tokens} tokens ({out['observation_tokens']} "
          f"observation tokens between turns), {a.model}, {a.threads} thread(s), {a.repeats} repeats:")
    print("| rollout | median s | per s | tokens (median) | tokens/s |\n|---|---|---|---|---|")
    print(f"| episodes ({a.turns} engine calls) | {m['episode_s']:.2f} | {out['episodes_per_s']:.1f} | "
          f"{m['episode_tokens']:.0f} ({m['episode_policy_tokens']:.0f} policy) | {out['episode_tokens_per_s']:.0f} |")
    print(f"| single turn, same budget | {m['single_s']:.2f} | {out['single_turn_per_s']:.1f} | "
          f"{m['single_tokens']:.0f} | {out['single_tokens_per_s']:.0f} |")
    print(f"ratio episode/single time: median {statistics.median(out['per_repeat']['ratio']):.2f} "
          f"(per repeat {', '.join(f'{r:.2f}' for r in out['per_repeat']['ratio'])}); environment steps "
          f"{100 * out['env_share']:.1f}% of the episodes' time")
    name = "tiny" if a.model == "tiny" else Path(a.model).name
    path = RESULTS / f"episodes_{name}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
