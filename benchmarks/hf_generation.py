"""The HF engine's generation: the shared prefill against per-row prefill, where a decode step's time goes, and
transformers' static KV cache with a compiled decode step.

    .venv/bin/python -m benchmarks.hf_generation                       # Countdown prompts, the tiny policy
    .venv/bin/python -m benchmarks.hf_generation --prompt-prefix-tokens 243 --max-new-tokens 64 --hidden 256 \\
        --layers 8 --prompts 8                                          # long prompts
    .venv/bin/python -m benchmarks.hf_generation --static-cache         # also the static cache, compiled

Writes ``benchmarks/results/hf_generation_<name>.json`` and prints a table.

Arms (one engine each, over the same weights and prompts, alternated ``--repeats`` times in one process, the same
seed before every call):

- ``before``: the engine as it was before issue 37: every row's prompt prefilled and transformers' ``DynamicCache``,
  which copies the whole cache every decode step (what TRL's ``generate`` call does).
- ``per_row``: ``HFEngine(shared_prefill=False)``: every row's prompt prefilled, the decode steps writing into a
  :class:`~lit_rlft.rollout.engines.kv_cache.ReservedCache`.
- ``shared``: ``HFEngine()`` (the default): each group's prompt prefilled once, its KV cache copied to the ``G`` rows.
- ``static`` (``--static-cache``): ``HFEngine(static_cache=True)``: a preallocated cache and a compiled decode step
  (the first call compiles; its time is reported apart and left out of the median).

Every arm runs all ``--max-new-tokens`` decode steps (the stop id is one the policy never samples), so the arms do
the same work. Reported: the median seconds per call, the ratio to ``before`` (each repeat's pair, then the median),
whether the arms sampled the same tokens (same seed) and the largest log-prob difference; and a profile of one
``before`` and one ``per_row`` call: the prefill's time, the median decode step, the share of time inside the model's forward, and the
operators that take the most time (``torch.profiler``).
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

from benchmarks.step_time_vs_trl import prompt_prefix  # noqa: E402
from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2  # noqa: E402
from lit_rlft.records.jsonio import write_result  # noqa: E402
from lit_rlft.rollout import HFEngine, SamplingConfig  # noqa: E402


class TransformersCache(HFEngine):
    """The engine with transformers' own ``DynamicCache`` (``generate`` builds it), as before issue 37."""

    def _new_cache(self, max_new_tokens: int) -> None:
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--prompt-prefix-tokens", type=int, default=0, help="a fixed text before every Countdown prompt")
    p.add_argument("--hidden", type=int, default=None, help="the tiny policy's hidden size (default TinyConfig's)")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--static-cache", action="store_true", help="also the static cache with a compiled decode step")
    p.add_argument("--name", default=None, help="results file suffix (default: from the settings)")
    p.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[Any, Any, list[list[int]]]:
    from lit_rlft.data import CountdownTask

    tok = char_tokenizer()
    size: dict[str, Any] = {"max_position_embeddings": max(256, 2 * (args.prompt_prefix_tokens + 16
                                                                      + args.max_new_tokens))}
    if args.hidden:
        heads = max(1, args.hidden // 64)
        size.update(hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_attention_heads=heads,
                    num_key_value_heads=heads)
    if args.layers:
        size["num_hidden_layers"] = args.layers
    model = tiny_qwen2(tok, TinyConfig(**size)).eval()
    prefix = prompt_prefix(args)
    task = CountdownTask(size=args.prompts, num_numbers=[2, 3, 4], split="train", seed=0)
    prompts = [tok(prefix + record.data["prompt"])["input_ids"] for record in task.records()[: args.prompts]]
    return model, tok, prompts


def profile(engine: HFEngine, prompts: list[list[int]], args: argparse.Namespace,
            sampling: SamplingConfig) -> dict[str, Any]:
    """One call, timed by forward hooks on the model, then once more under ``torch.profiler``."""
    model = engine.model
    spans: list[float] = []
    pre = model.register_forward_pre_hook(lambda *_: spans.append(-time.perf_counter()))
    post = model.register_forward_hook(lambda *_: spans.__setitem__(-1, spans[-1] + time.perf_counter()))
    try:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        engine.generate(prompts, args.generations, sampling)
        total = time.perf_counter() - t0
    finally:
        pre.remove()
        post.remove()
    with torch.profiler.profile() as prof:
        torch.manual_seed(0)
        engine.generate(prompts, args.generations, sampling)
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    op_total = sum(e.self_cpu_time_total for e in ops)
    return {
        "call_s": total,
        "prefill_s": spans[0],
        "median_decode_step_s": statistics.median(spans[1:]),
        "forward_share": sum(spans) / total,
        "outside_forward_per_token_s": (total - sum(spans)) / sampling.max_new_tokens,
        "top_ops": [{"op": e.key, "share": e.self_cpu_time_total / op_total} for e in ops[:6]],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok, prompts = build(args)
    never = model.config.vocab_size - 1  # a stop id the policy does not sample: every arm decodes every step
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens)
    arms = {"before": TransformersCache.bound(model, tok, return_logprobs=True, shared_prefill=False),
            "per_row": HFEngine.bound(model, tok, return_logprobs=True, shared_prefill=False),
            "shared": HFEngine.bound(model, tok, return_logprobs=True)}
    if args.static_cache:
        arms["static"] = HFEngine.bound(model, tok, return_logprobs=True, static_cache=True)
    for engine in arms.values():
        engine.eos_token_ids = [never]
    first: dict[str, float] = {}
    times: dict[str, list[float]] = {name: [] for name in arms}
    outputs: dict[str, Any] = {}
    for r in range(args.repeats + 1):  # the first round warms up (and compiles the static arm)
        for name, engine in arms.items():
            torch.manual_seed(1234)
            t0 = time.perf_counter()
            out = engine.generate(prompts, args.generations, sampling)
            elapsed = time.perf_counter() - t0
            if r == 0:
                first[name] = elapsed
                outputs[name] = out
            else:
                times[name].append(elapsed)
        if r:
            print(f"repeat {r}: " + ", ".join(f"{n} {times[n][-1]:.3f} s" for n in arms), flush=True)
    base = outputs["before"]
    arms_out = {}
    for name in arms:
        pair = [t / b for t, b in zip(times[name], times["before"])]
        out = outputs[name]
        arms_out[name] = {
            "median_s": statistics.median(times[name]), "times_s": times[name], "first_call_s": first[name],
            "ratio_to_before": statistics.median(pair),
            "same_tokens_as_before": bool(torch.equal(out.completion_ids, base.completion_ids)),
            "rows_differing": int((out.completion_ids != base.completion_ids).any(dim=1).sum()),
            "max_logprob_difference": float((out.logprobs - base.logprobs).abs().max()),
        }
    prof = {name: profile(arms[name], prompts, args, sampling) for name in ("before", "per_row")}
    n_params = sum(p.numel() for p in model.parameters())
    prompt_tokens = statistics.mean(len(p) for p in prompts)
    lines = ["| arm | median s per call | ratio to before | first call s | same tokens (rows differing) | "
             "max log-prob difference |", "|---|---|---|---|---|---|"]
    for name, a in arms_out.items():
        lines.append(f"| {name} | {a['median_s']:.3f} | {a['ratio_to_before']:.2f} | {a['first_call_s']:.2f} | "
                     f"{a['same_tokens_as_before']} ({a['rows_differing']}) | {a['max_logprob_difference']:.1e} |")
    table = "\n".join(lines)
    print()
    print(f"{args.prompts} prompts x {args.generations}, prompts of {prompt_tokens:.0f} tokens, "
          f"{args.max_new_tokens} new tokens, {n_params / 1e6:.2f}M parameters, {args.threads} thread(s)")
    print(table)
    for name, p in prof.items():
        print(f"profile of one {name} call: {p['call_s']:.3f} s, prefill {p['prefill_s'] * 1e3:.1f} ms, decode step "
              f"{p['median_decode_step_s'] * 1e3:.2f} ms, {p['forward_share']:.0%} inside the model's forward, "
              f"{p['outside_forward_per_token_s'] * 1e3:.2f} ms per token outside it; top operators: "
              + ", ".join(f"{o['op']} {o['share']:.0%}" for o in p["top_ops"]))
    name = args.name or (f"p{round(prompt_tokens)}_l{args.max_new_tokens}_h{model.config.hidden_size}"
                         f"_n{model.config.num_hidden_layers}")
    result = {
        "command": "python -m benchmarks.hf_generation " + " ".join(sys.argv[1:] if argv is None else argv),
        "config": {**vars(args), "mean_prompt_tokens": prompt_tokens, "n_parameters": n_params},
        "arms": arms_out, "profiles": prof, "table_markdown": table,
    }
    out_path = write_result(Path(args.out_dir) / f"hf_generation_{name}.json", result)
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
