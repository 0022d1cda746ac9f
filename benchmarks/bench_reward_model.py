"""Reward-model scoring: 512 completions batched by tokens (RewardModel) against one completion at a time, and peak
memory against the token budget (against TRL's one padded forward of the whole batch).

    .venv/bin/python -m benchmarks.bench_reward_model                      # SmolLM2-135M as the reward model
    .venv/bin/python -m benchmarks.bench_reward_model --model tiny --repeats 5

Writes ``benchmarks/results/reward_model_<model>.json`` and prints a table. Goal (issue 26): batched >= 10x one at a
time on CPU; peak memory bounded by the token budget.

- Texts: 512 Countdown prompts with completions sampled from the problem's own numbers (ragged lengths, as a
  policy's completions are), read through the reward model's chat template when it has one.
- Speed: the same 512 texts scored by ``RewardModel(max_batch_tokens=budget)`` and by a loop of one unpadded
  forward per text, alternated ``--repeats`` times in one process (the machine is shared: medians and the ratio of
  each repeat's pair).
- Memory: each budget in a fresh subprocess (one thread); the figure is the highest resident memory sampled every
  0.5 ms while scoring, less the resident memory just before (the model loaded, one text scored). ``all`` is TRL's
  way: every text in one padded forward.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
N = 512


def texts_and_prompts(n: int = N, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` Countdown prompts and completions of ragged length (expressions over the problem's numbers)."""
    from lit_rlft.data import CountdownTask

    rng = random.Random(seed)
    task = CountdownTask(size=n, num_numbers=[2, 3, 4, 5], split="train", seed=seed)
    prompts, completions = [], []
    for record in task.records():
        prompt, numbers = record.data["prompt"], list(record.data["nums"])
        ops = "+-*"
        expr = str(rng.choice(numbers))
        for _ in range(rng.randint(1, 2 * len(numbers))):
            expr = f"({expr}{rng.choice(ops)}{rng.choice(numbers)})" if rng.random() < 0.3 else \
                f"{expr}{rng.choice(ops)}{rng.choice(numbers)}"
        prompts.append(prompt)
        completions.append(expr)
        if len(prompts) == n:
            break
    return prompts, completions


def build(model: str):
    """``(RewardModel factory, the sequence classifier, its tokenizer)``."""
    from lit_rlft.rewards import RewardModel

    if model == "tiny":
        from lit_rlft.models.tiny import char_tokenizer, tiny_reward_model

        tok = char_tokenizer()
        module = tiny_reward_model(tok)
    else:
        from transformers import AutoModelForSequenceClassification

        from lit_rlft.models.loading import load_tokenizer_for, resolve_model_path

        path = resolve_model_path(model)
        tok = load_tokenizer_for(model)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # the score head is new: seeded, so every process holds the same reward model
            module = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
        module.config.pad_token_id = tok.pad_token_id
    return (lambda budget: RewardModel(module, tok, max_batch_tokens=budget, device="cpu")), module, tok


def one_at_a_time(reward, rows: list[list[int]]) -> list[float]:
    """The unbatched baseline: one unpadded forward per text (what scoring each completion alone costs)."""
    out = []
    with torch.inference_mode():
        for row in rows:
            out.append(float(reward.model(input_ids=torch.tensor([row])).logits[0, reward.label]))
    return out


def speed(model: str, budget: int, repeats: int) -> dict:
    make, _, _ = build(model)
    reward = make(budget)
    prompts, completions = texts_and_prompts()
    rows = reward.encode(reward.texts(completions, prompts))
    batched = reward.forward_ids(rows).tolist()  # warm-up, and the values to compare
    single = one_at_a_time(reward, rows)
    err = max(abs(a - b) for a, b in zip(batched, single))
    t_batched, t_single = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        reward.forward_ids(rows)
        t_batched.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        one_at_a_time(reward, rows)
        t_single.append(time.perf_counter() - t0)
    ratios = [s / b for s, b in zip(t_single, t_batched)]
    lengths = [len(r) for r in rows]
    return {"n": len(rows), "budget": budget, "tokens": sum(lengths), "min_len": min(lengths), "max_len": max(lengths),
            "batched_s": t_batched, "single_s": t_single, "median_batched_s": statistics.median(t_batched),
            "median_single_s": statistics.median(t_single), "ratio_median": statistics.median(ratios),
            "ratios": ratios, "max_abs_diff": err}


def memory_child(model: str, budget: str) -> None:
    """In a fresh process: peak RSS growth while scoring the 512 texts with this budget (``all``: one forward)."""
    torch.set_num_threads(1)
    make, _, _ = build(model)
    prompts, completions = texts_and_prompts()
    reward = make(10**9 if budget == "all" else int(budget))
    rows = reward.encode(reward.texts(completions, prompts))
    reward.forward_ids(rows[:1])
    base = _rss_mb()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.0005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    reward.forward_ids(rows)
    done.set()
    thread.join()
    padded = len(rows) * max(len(r) for r in rows) if budget == "all" else None
    print(json.dumps({"budget": budget, "peak_growth_mb": peak[0] - base, "padded_tokens_one_forward": padded}))


def _rss_mb() -> float:
    """This process's resident memory now (Linux ``/proc/self/statm``), in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def memory(model: str, budgets: list[str]) -> list[dict]:
    out = []
    for budget in budgets:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_reward_model", "--model", model,
                               "--memory-child", budget], capture_output=True, text=True, check=True)
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="'tiny' or a checkpoint (default SmolLM2-135M)")
    p.add_argument("--budget", type=int, default=8192, help="max_batch_tokens for the speed comparison")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--memory-budgets", default="1024,4096,16384,all")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.memory_child is not None:
        memory_child(a.model, a.memory_child)
        return
    torch.set_num_threads(a.threads)
    result = {"model": a.model, "threads": a.threads,
              "command": " ".join(["python -m benchmarks.bench_reward_model", *sys.argv[1:]])}
    result["speed"] = speed(a.model, a.budget, a.repeats)
    result["memory"] = memory(a.model, a.memory_budgets.split(","))
    s = result["speed"]
    print(f"{s['n']} completions ({s['tokens']} tokens, {s['min_len']}-{s['max_len']} per text), {a.model}:")
    print(f"  batched (max_batch_tokens={s['budget']}): median {s['median_batched_s']:.3f} s; one at a time: "
          f"{s['median_single_s']:.3f} s; ratio {s['ratio_median']:.1f}x (per repeat "
          f"{', '.join(f'{r:.1f}' for r in s['ratios'])}); largest score difference {s['max_abs_diff']:.2e}")
    print("| token budget | peak memory growth while scoring (MB) |\n|---|---|")
    for m in result["memory"]:
        extra = f" (one padded forward of {m['padded_tokens_one_forward']} tokens)" if m["padded_tokens_one_forward"] \
            else ""
        print(f"| {m['budget']}{extra} | {m['peak_growth_mb']:.1f} |")
    name = "tiny" if a.model == "tiny" else Path(a.model).name
    from lit_rlft.records.jsonio import write_result

    out = write_result(RESULTS / f"reward_model_{name}.json", result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
