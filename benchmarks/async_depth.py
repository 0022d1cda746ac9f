"""Steps per second at asynchronous depth 1 against the synchronous step (depth 0), side by side, equal cores.

    python benchmarks/async_depth.py --steps 12 --rounds 2                                   # the tiny policy
    python benchmarks/async_depth.py --hidden 256 --layers 8 --prompts 8 --max-new-tokens 64 --steps 8
    python benchmarks/async_depth.py --model smollm2-135m-instruct --prompts 4 --generations 4 --max-new-tokens 64 \
        --steps 6 --warmup 2
    .venv-vllm/bin/python benchmarks/async_depth.py --model smollm2-135m-instruct --engine vllm ...   # vLLM engine

Both depths run the plain loop of ``docs/design.md`` (``build_step`` + ``TorchBackend``) on the same prompts, in this
process one after the other, alternating in rounds so that load from elsewhere hits both alike. Equal cores in
total: depth 0 trains and generates in one process with ``--cores`` torch threads; depth 1 gives the trainer
``--cores - 1`` threads (at least 1) and its generation process the rest. Rewards are coin flips (a reward that costs
nothing and gives groups a spread). A step's time is the wall time between consecutive steps' ends; the first
``--warmup`` steps of each run are left out (depth 1's first step waits for the generation process to start).
Prints a table and writes every step's time to ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def coin_reward(completions: list[str], **columns: Any) -> list[float]:
    """1 with probability 1/2 per completion (torch's generator, seeded per step by the step)."""
    return (torch.rand(len(completions)) < 0.5).float().tolist()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="'tiny' (built locally), 'smollm2-135m-instruct' or a folder")
    p.add_argument("--hidden", type=int, default=None, help="the tiny model's hidden size (default TinyConfig's)")
    p.add_argument("--layers", type=int, default=None, help="the tiny model's decoder layers")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=12, help="rollout steps per run (warm-up included)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="rounds of [depth 0 run, depth 1 run]")
    p.add_argument("--depths", type=int, nargs="+", default=[0, 1])
    p.add_argument("--cores", type=int, default=2, help="torch threads in all, per depth")
    p.add_argument("--split", default=None, help="depth >= 1: 'trainer,generation' torch threads (default: cores - 1, "
                                                  "the rest)")
    p.add_argument("--device", default="cpu", help="the trainer's device (cpu, cuda)")
    p.add_argument("--generation-device", default=None,
                   help="depth >= 1: the generation process's device (default: cuda:1 when there are two GPUs, else "
                        "the trainer's)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "async_depth.json"))
    return p.parse_args(argv)


def run(a: argparse.Namespace, depth: int) -> dict[str, Any]:
    from lit_rlft import (
        AsyncConfig,
        CountdownTask,
        GenerationConfig,
        GRPOConfig,
        OptimConfig,
        PromptDataModule,
        build_step,
    )
    from lit_rlft.models.tiny import TinyConfig
    from lit_rlft.step import TorchBackend
    from lit_rlft.step.optim import configure_adamw

    trainer_threads, generation_threads = a.cores, 0
    if depth > 0:
        trainer_threads, generation_threads = (int(x) for x in a.split.split(",")) if a.split else \
            (max(1, a.cores - 1), max(1, a.cores - max(1, a.cores - 1)))
    torch.set_num_threads(trainer_threads)
    tiny = None
    if a.model == "tiny" and (a.hidden or a.layers):
        base = TinyConfig()
        hidden = a.hidden or base.hidden_size
        tiny = TinyConfig(hidden_size=hidden, num_hidden_layers=a.layers or base.num_hidden_layers,
                          num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 64),
                          intermediate_size=4 * hidden, head_dim=64)
    engine = None
    if a.engine == "vllm":
        from lit_rlft.rollout.engines.vllm import VLLMEngine

        engine = VLLMEngine(dtype="float32", max_model_len=512, kv_cache_memory_bytes=256 * 2**20)
    gen_device = a.generation_device or ("cuda:1" if a.device.startswith("cuda") and torch.cuda.device_count() > 1
                                         else a.device)
    config = GRPOConfig(
        model=a.model, tiny=tiny, engine=engine, reward_funcs=["benchmarks.async_depth.coin_reward"],
        generation=GenerationConfig(num_generations=a.generations, max_completion_length=a.max_new_tokens),
        asynchronous=AsyncConfig(depth=depth, threads=generation_threads or None,
                                 device=gen_device if depth else None),
        optim=OptimConfig(learning_rate=1e-5))
    step = build_step(config)
    step.policy.to(a.device)
    data = PromptDataModule(train=CountdownTask(size=2000, num_numbers=[2, 3, 4], split="train", seed=0),
                            answer_field=None, batch_size=a.prompts)
    data.setup("fit")
    step.bind(data)
    opt = configure_adamw(step.policy, step.optim, total_steps=None)
    backend = TorchBackend(step.policy, opt["optimizer"], opt["lr_scheduler"]["scheduler"])
    ends, rows = [], []
    try:
        step.start()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            out = step.run(backend)
            ends.append(time.perf_counter() - t0)
            rows.append({k: float(v) for k, v in out.metrics.items()
                         if k.startswith(("time/", "async/")) or k == "loss"})
    finally:
        step.close()
    times = [b - e for e, b in zip([0.0, *ends[:-1]], ends)][a.warmup:]
    gen = statistics.median(r["time/generation_s"] for r in rows[a.warmup:])
    return {"depth": depth, "trainer_threads": trainer_threads, "generation_threads": generation_threads,
            "step_s": times, "median_step_s":
            statistics.median(times), "steps_per_s": 1.0 / statistics.median(times), "median_generation_s": gen,
            "metrics": rows}


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    runs: list[dict[str, Any]] = []
    for r in range(a.rounds):
        for depth in a.depths:
            res = run(a, depth)
            res["round"] = r + 1
            runs.append(res)
            print(f"round {r + 1} depth {depth}: median step {res['median_step_s']:.3f} s "
                  f"({res['steps_per_s']:.2f} steps/s), generation {res['median_generation_s']:.3f} s", flush=True)
    pooled = {d: statistics.median(t for x in runs if x["depth"] == d for t in x["step_s"]) for d in a.depths}
    base = pooled[a.depths[0]]
    sync = [x for x in runs if x["depth"] == 0]
    share = statistics.median(m["time/generation_s"] / m["time/step_s"] for x in sync
                              for m in x["metrics"][a.warmup:]) if sync else float("nan")
    print(f"\n| depth | median step (s) | steps/s | speed vs depth {a.depths[0]} |")
    print("|---|---|---|---|")
    for d in a.depths:
        print(f"| {d} | {pooled[d]:.3f} | {1 / pooled[d]:.2f} | {base / pooled[d]:.2f}x |")
    print(f"\ngeneration share of the synchronous step: {share:.2f}")
    from lit_rlft.records.jsonio import write_result

    write_result(a.out, {"args": vars(a), "pooled_median_step_s": pooled, "generation_share": share, "runs": runs})
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
