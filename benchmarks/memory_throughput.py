"""Memory and throughput: gradient checkpointing, packed passes, replay, and lit_rlft against TRL at equal settings.

    .venv/bin/python benchmarks/memory_throughput.py                      # CPU, every part (about 20-30 minutes)
    .venv/bin/python benchmarks/memory_throughput.py --parts update,packing --repeats 3
    python benchmarks/memory_throughput.py --accelerator gpu --bf16 --hidden 896 --layers 24   # one GPU

Parts (``--parts``), each printed as a table and written to ``--out`` (JSON):

- ``update``: the peak memory of one policy update (no generation) at a long-completion setting, with and without
  gradient checkpointing, each in a fresh process: on CPU the rise of the process's peak RSS over its RSS just
  before the update; on a GPU ``torch.cuda.max_memory_allocated`` during it.
- ``packing``: the time of one update on a batch of very uneven lengths, padded against packed
  (``padding_free``), alternating in one process; the padding share the packed pass avoids.
- ``packing_memory``: the peak memory of that update, padded against packed, each in a fresh process, with the
  vocabulary grown to ``--vocab`` (Qwen2.5's 151,936 by default) so that the logits weigh what they weigh in a real
  model: a packed pass computes logits only where completion tokens are predicted.
- ``chunked``: the peak memory and time of one update at Qwen2's vocabulary (``--vocab``) and long completions,
  with the full logits (``model.optim.logprob_chunk_tokens: null``) against chunked log-probs (``auto``: 441
  positions per chunk at 151,936 tokens), each update in a fresh process, at ``--rows`` sequences of each length in
  ``--lengths``; the full side only up to ``--full-max`` tokens (its logits alone weigh ``rows x L x V x 4`` bytes,
  10 GB at 8 x 2,048). From a straight line through each side's peaks: the longest completion one update holds in
  ``--budget-gib``. ``--trl``: also TRL 1.16's way on the same batch and weights (its fused LM head, tiles of
  4,096 tokens x 32,768 vocabulary entries; on a CPU it scores every position of prompt and completion).
- ``trl``: whole GRPO steps, lit_rlft against TRL's ``GRPOTrainer`` (``benchmarks/step_time_vs_trl.py``, the same
  weights, prompts and settings on both sides), gradient checkpointing off on both and on on both; each side in a
  fresh process. Peak memory: on a GPU the max allocated during training; on CPU the rise of the resident set over
  what the process held when training started (weights loaded, libraries imported), sampled every 10 ms. Step time,
  generation share.
- ``replay``: lit_rlft's step time, uniform against ``ReplayCallback(delta=0.5)`` (half the groups generated), with
  coin-flip rewards: the untrained policy never solves Countdown, and replay needs groups with reward variance.

Medians over ``--repeats``; the two sides of every comparison alternate, so a shared, noisy machine hits both alike.
The load average is recorded with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="update,packing,trl,replay")
    p.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256, help="the random Qwen2's hidden size")
    p.add_argument("--layers", type=int, default=8, help="its decoder layers")
    p.add_argument("--vocab", type=int, default=151936, help="packing_memory: the vocabulary size")
    p.add_argument("--rows", type=int, default=8, help="update: sequences in the update")
    p.add_argument("--completion", type=int, default=1024, help="update: completion tokens per sequence")
    p.add_argument("--prompts", type=int, default=8, help="trl / replay: prompts per step")
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--lengths", default="256,512,1024,2048", help="chunked: completion lengths")
    p.add_argument("--full-max", type=int, default=1024, help="chunked: longest completion the full side runs")
    p.add_argument("--trl", action="store_true", help="chunked: also TRL 1.16's fused LM head on the same batch")
    p.add_argument("--budget-gib", type=float, default=8.0, help="chunked: the memory the longest update must fit")
    p.add_argument("--steps", type=int, default=5, help="trl / replay: steps per run (the first is discarded)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="JSON (default benchmarks/results/memory_throughput_<acc>.json)")
    return p.parse_args(argv)


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def _device(args: argparse.Namespace) -> str:
    return "cuda" if args.accelerator == "gpu" else "cpu"


def _policy(args: argparse.Namespace, gradient_checkpointing: bool = False, vocab: int | None = None) -> Any:
    import torch

    from lit_rlft.models.loading import build_policy
    from lit_rlft.models.tiny import TinyConfig

    heads = max(1, args.hidden // 64)
    torch.manual_seed(0)
    cfg = TinyConfig(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=heads,
                     num_key_value_heads=heads, intermediate_size=4 * args.hidden, head_dim=64)
    policy = build_policy("tiny", tiny=cfg, gradient_checkpointing=gradient_checkpointing)[0]
    if vocab is not None:
        policy.resize_token_embeddings(vocab)
    return policy.to(_device(args)).train()


def _batch(rows: int, prompt: int, completion: int, uneven: bool, seed: int = 0) -> Any:
    """Synthetic rollouts: ``rows`` sequences; ``uneven``: prompts of 8..prompt and completions of 8..completion."""
    import torch

    from lit_rlft.core.types import Rollouts

    g = torch.Generator().manual_seed(seed)
    G = 2
    B = rows // G
    p_len = (torch.randint(8, prompt + 1, (B,), generator=g) if uneven else torch.full((B,), prompt)).repeat_interleave(G)
    c_len = torch.randint(8, completion + 1, (rows,), generator=g) if uneven else torch.full((rows,), completion)
    p_mask = (torch.arange(prompt)[None] >= (prompt - p_len)[:, None]).long()
    c_mask = (torch.arange(completion)[None] < c_len[:, None]).long()
    rewards = torch.tensor([[0.0, 1.0]] * B)
    return Rollouts(
        prompt_ids=torch.arange(B), prompt_tokens=torch.randint(3, 90, (rows, prompt), generator=g) * p_mask,
        prompt_mask=p_mask, completion_tokens=torch.randint(3, 90, (rows, completion), generator=g) * c_mask,
        completion_mask=c_mask, rewards=rewards, correct=rewards >= 1, birth_step=torch.zeros(B, dtype=torch.long),
        is_replay=torch.zeros(B, dtype=torch.bool), truncated=c_len == completion,
    )


def _update(args: argparse.Namespace, policy: Any, rollouts: Any, padding_free: bool = False,
            logprob_chunk_tokens: int | str | None = None) -> float:
    """Seconds of one update (one optimizer step over the whole batch; full logits unless ``logprob_chunk_tokens``)."""
    import torch

    from lit_rlft.core.losses import GRPOLoss
    from lit_rlft.step.update import PolicyUpdater, TorchBackend

    backend = TorchBackend(policy, torch.optim.SGD(policy.parameters(), lr=1e-4), device=_device(args))
    updater = PolicyUpdater(GRPOLoss(), temperature=1.0, padding_free=padding_free,
                            logprob_chunk_tokens=logprob_chunk_tokens)
    advantages = torch.tensor([-1.0, 1.0]).repeat(rollouts.num_groups)
    t0 = time.perf_counter()
    with torch.autocast(_device(args), dtype=torch.bfloat16, enabled=args.bf16):
        updater.update(rollouts, advantages, backend)
    if args.accelerator == "gpu":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _trl_update(policy: Any, rollouts: Any) -> float:
    """Seconds of one update the way TRL 1.16's ``GRPOTrainer`` takes log-probs: its fused LM head
    (``trl.trainer.utils.add_fused_lm_head``, the call its ``__init__`` makes: tiles of 4,096 tokens x 32,768 vocabulary
    entries, online logsumexp, recomputed in the backward) and ``_get_per_token_logps_and_entropies``' call of it
    (labels -100 outside the completions, ``fused_lm_head=True``), then the grpo loss and one SGD step."""
    import torch
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(policy, temperature=1.0, outputs=("log_probs", "entropy"))
    opt = torch.optim.SGD(policy.parameters(), lr=1e-4)
    prompt, comp = rollouts.prompt_tokens, rollouts.completion_tokens
    mask = rollouts.completion_mask
    input_ids = torch.cat([prompt, comp], dim=1)
    attention = torch.cat([rollouts.prompt_mask, mask], dim=1)
    length = comp.shape[1]
    advantages = torch.tensor([-1.0, 1.0]).repeat(rollouts.num_groups)[:, None]
    t0 = time.perf_counter()
    labels = input_ids.masked_fill(attention == 0, -100)
    labels[:, :-length] = -100
    out = policy(input_ids=input_ids, attention_mask=attention, labels=labels, fused_lm_head=True)
    logps = out.log_probs[:, -length:]  # [B, L]
    per_token = -torch.exp(logps - logps.detach()) * advantages
    loss = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()  # grpo: sequence mean
    loss.backward()
    opt.step()
    return time.perf_counter() - t0


def child_update(args: argparse.Namespace, flag: str) -> dict[str, float]:
    """One update in this (fresh) process: its peak memory and seconds. ``flag``: ``update-off`` / ``update-on``
    (gradient checkpointing) or ``packing-padded`` / ``packing-packed`` (the uneven batch of ``packing``)."""
    import resource

    import torch

    from benchmarks.step_time_vs_trl import rss_mib

    torch.set_num_threads(args.threads)
    if flag.startswith("chunked"):  # chunked-{full,auto}-{L}
        _, side, length = flag.split("-")
        policy = _policy(args, vocab=args.vocab)
        rollouts = _batch(args.rows, 64, int(length), uneven=False)
        base = rss_mib()
        if side == "trl":
            seconds = _trl_update(policy, rollouts)
        else:
            seconds = _update(args, policy, rollouts, logprob_chunk_tokens=None if side == "full" else "auto")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return {"peak_rise_mib": peak - base, "seconds": seconds}
    if flag.startswith("packing"):
        policy = _policy(args, vocab=args.vocab)
        rollouts = _batch(16, 256, 512, uneven=True, seed=1)
    else:
        policy = _policy(args, gradient_checkpointing=flag == "update-on")
        rollouts = _batch(args.rows, 64, args.completion, uneven=False)
    if args.accelerator == "gpu":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        base = rss_mib()
    seconds = _update(args, policy, rollouts, padding_free=flag == "packing-packed")
    peak = (torch.cuda.max_memory_allocated() / 2**20 if args.accelerator == "gpu"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return {"peak_rise_mib": peak - base, "seconds": seconds}


def _child(args: argparse.Namespace, flag: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", flag, *[a for a in sys.argv[1:] if not a.startswith("--child")]]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO).stdout
    return json.loads(out.strip().splitlines()[-1])


def _fresh_processes(args: argparse.Namespace, part: str,
                     sides: tuple[str, str]) -> tuple[dict[str, Any], dict[str, list[dict[str, float]]]]:
    """``--repeats`` fresh-process updates per side (``--child {part}-{side}``), the sides alternating; medians."""
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for r in range(args.repeats):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            runs[side].append(_child(args, f"{part}-{side}"))
    medians: dict[str, Any] = {k: {"peak_rise_mib": _median([x["peak_rise_mib"] for x in v]),
                                   "seconds": _median([x["seconds"] for x in v])} for k, v in runs.items()}
    return medians, runs


def part_update(args: argparse.Namespace) -> dict[str, Any]:
    out, runs = _fresh_processes(args, "update", ("off", "on"))
    out["memory_ratio_on_over_off"] = out["on"]["peak_rise_mib"] / out["off"]["peak_rise_mib"]
    out["time_ratio_on_over_off"] = out["on"]["seconds"] / out["off"]["seconds"]
    out["setting"] = (f"{args.rows} sequences x (64 prompt + {args.completion} completion) tokens, random Qwen2 hidden "
                      f"{args.hidden}, {args.layers} layers, one update over the whole batch, dapo loss, fp32"
                      + (" + bf16 autocast" if args.bf16 else ""))
    out["raw"] = runs
    return out


def part_packing(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from lit_rlft.step.batching import padding_share

    torch.set_num_threads(args.threads)
    policy = _policy(args)
    rollouts = _batch(16, 256, 512, uneven=True, seed=1)
    share = padding_share(rollouts, [torch.arange(16)], packed=False, trimmed=False)
    _update(args, policy, rollouts)  # warm-up
    times: dict[str, list[float]] = {"padded": [], "packed": []}
    for r in range(max(args.repeats, 3)):
        for side in (("padded", "packed") if r % 2 == 0 else ("packed", "padded")):
            times[side].append(_update(args, policy, rollouts, padding_free=side == "packed"))
    med = {k: _median(v) for k, v in times.items()}
    return {"padded_s": med["padded"], "packed_s": med["packed"], "ratio_packed_over_padded": med["packed"] / med["padded"],
            "padding_share": share, "raw": times,
            "setting": (f"16 sequences, prompts of 8..256 and completions of 8..512 tokens (uniform), one update, "
                        f"random Qwen2 hidden {args.hidden}, {args.layers} layers, fp32")}


def part_packing_memory(args: argparse.Namespace) -> dict[str, Any]:
    out, runs = _fresh_processes(args, "packing", ("padded", "packed"))
    out["memory_ratio_packed_over_padded"] = out["packed"]["peak_rise_mib"] / out["padded"]["peak_rise_mib"]
    out["setting"] = (f"the packing batch (16 sequences, prompts of 8..256, completions of 8..512 tokens), one update, "
                      f"random Qwen2 hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab}, fp32"
                      + (" + bf16 autocast" if args.bf16 else ""))
    out["raw"] = runs
    return out


def part_chunked(args: argparse.Namespace) -> dict[str, Any]:
    """Fresh-process updates, full logits against chunked, at each length (the sides alternating); per side a line
    ``peak = a + b L`` fitted through its peaks and the longest ``L`` within ``--budget-gib``."""
    lengths = [int(x) for x in args.lengths.split(",")]
    names = ("full", "auto", "trl") if args.trl else ("full", "auto")
    runs: dict[str, dict[int, list[dict[str, float]]]] = {name: {} for name in names}
    for r in range(args.repeats):
        for length in lengths:
            sides = [s for s in names if s != "full" or length <= args.full_max]
            for side in (sides if r % 2 == 0 else sides[::-1]):
                runs[side].setdefault(length, []).append(_child(args, f"chunked-{side}-{length}"))
                print(f"chunked {side} L={length}: {runs[side][length][-1]}", flush=True)
    out: dict[str, Any] = {}
    for side, by_length in runs.items():
        if not by_length:  # --full-max below every length
            continue
        rows = {length: {"peak_rise_mib": _median([x["peak_rise_mib"] for x in v]),
                         "seconds": _median([x["seconds"] for x in v])} for length, v in sorted(by_length.items())}
        xs, ys = list(rows), [rows[x]["peak_rise_mib"] for x in rows]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs) if len(xs) > 1 \
            else float("nan")  # one length: no line
        intercept = my - slope * mx
        out[side] = {"by_length": rows, "mib_per_token_of_length": slope, "intercept_mib": intercept,
                     "longest_in_budget": int((args.budget_gib * 1024 - intercept) / slope) if slope > 0 else None}
    for other in [n for n in names if n != "auto" and n in out]:
        common = [x for x in out[other]["by_length"] if x in out["auto"]["by_length"]]
        out[f"memory_ratio_auto_over_{other}"] = {x: out["auto"]["by_length"][x]["peak_rise_mib"]
                                                  / out[other]["by_length"][x]["peak_rise_mib"] for x in common}
        out[f"time_ratio_auto_over_{other}"] = {x: out["auto"]["by_length"][x]["seconds"]
                                                / out[other]["by_length"][x]["seconds"] for x in common}
    out["setting"] = (f"{args.rows} sequences x (64 prompt + L completion) tokens, random Qwen2 hidden {args.hidden}, "
                      f"{args.layers} layers, vocabulary {args.vocab}, one update over the whole batch (no "
                      f"micro-batches), grpo loss, fp32, {args.threads} thread(s); peak: the rise of the process's "
                      f"peak RSS over its RSS before the update")
    out["raw"] = runs
    return out


def _step_time(args: argparse.Namespace, side: str, extra: list[str]) -> dict[str, Any]:
    out = Path("/tmp") / f"mt_{os.getpid()}_{side}.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "step_time_vs_trl.py"), "--order", side, "--rounds", "1",
           "--steps", str(args.steps), "--warmup", "1", "--threads", str(args.threads), "--prompts", str(args.prompts),
           "--generations", str(args.generations), "--max-new-tokens", str(args.max_new_tokens), "--hidden",
           str(args.hidden), "--layers", str(args.layers), "--accelerator", args.accelerator, "--out", str(out),
           *(["--bf16"] if args.bf16 else []), *extra]
    subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(out.read_text())["overall"]


def part_trl(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ckpt in ("off", "on"):
        extra = ["--gradient-checkpointing"] if ckpt == "on" else []
        runs: dict[str, list[dict[str, Any]]] = {"lit": [], "trl": []}
        for r in range(args.repeats):
            for side in (("lit", "trl") if r % 2 == 0 else ("trl", "lit")):
                runs[side].append(_step_time(args, side, extra))
        summary = {side: {k: _median([x[k] for x in v]) for k in ("median_step_s", "median_generation_share",
                                                                    "peak_memory_mib")} for side, v in runs.items()}
        summary["step_ratio_lit_over_trl"] = summary["lit"]["median_step_s"] / summary["trl"]["median_step_s"]
        summary["memory_ratio_lit_over_trl"] = summary["lit"]["peak_memory_mib"] / summary["trl"]["peak_memory_mib"]
        out[f"checkpointing_{ckpt}"] = summary
    return out


def part_replay(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"uniform": [], "replay": []}
    for r in range(args.repeats):
        for side in (("uniform", "replay") if r % 2 == 0 else ("replay", "uniform")):
            extra = ["--reward", "coin", *(["--replay-delta", "0.5"] if side == "replay" else [])]
            runs[side].append(_step_time(args, "lit", extra))
    out = {side: {k: _median([x[k] for x in v]) for k in ("median_step_s", "median_generation_s")}
           for side, v in runs.items()}
    out["step_ratio_replay_over_uniform"] = out["replay"]["median_step_s"] / out["uniform"]["median_step_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child_update(args, args.child)))
        return 0
    parts = {"update": part_update, "packing": part_packing, "packing_memory": part_packing_memory, "trl": part_trl,
             "replay": part_replay, "chunked": part_chunked}
    results: dict[str, Any] = {"command": "python benchmarks/memory_throughput.py " + " ".join(sys.argv[1:]),
                               "accelerator": args.accelerator, "threads": args.threads}
    for name in args.parts.split(","):
        t0 = time.perf_counter()
        results[name] = parts[name](args)
        results[name]["wall_s"] = time.perf_counter() - t0
        results[name]["load_avg_after"] = os.getloadavg()
        print(name, json.dumps({k: v for k, v in results[name].items() if k != "raw"}, indent=1), flush=True)
    from lit_rlft.records.jsonio import write_result

    out = write_result(args.out or REPO / "benchmarks" / "results" / f"memory_throughput_{args.accelerator}.json",
                       results)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
