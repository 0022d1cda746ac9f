"""A five-minute check of lit_rlft on a machine with one NVIDIA GPU (no network needed).

    python scripts/gpu_check.py                       # GPU: FSDP2 (NCCL) + LoRA + bf16-mixed + DPS + replay
    python scripts/gpu_check.py --accelerator cpu     # the same path on the CPU (gloo), as a smoke test

It trains a locally built, untrained Qwen2 (hidden 512, 8 layers, ~30M parameters, character tokenizer) on Countdown
prompts for a few GRPO steps, rewarded for starting its answer with a digit (an untrained policy does that about one
time in ten, which gives groups reward variance), and checks, printing one line per check:

1. the run trains under ``ModelParallelStrategy`` (FSDP2) with LoRA, ``precision: bf16-mixed`` and float32 master
   weights, DPS choosing the fresh half of each batch and replay the rest: finite losses, every LoRA matrix moved,
   no base weight moved;
2. step time, generation share and peak GPU memory (from the run's own metrics);
3. why the recipe keeps float32 master weights: one AdamW step at lr 1e-6 on the same weights in float32 and in
   bfloat16, and the fraction of weights each step changed.

Exit status 0 when every check passes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--accelerator", default="gpu", choices=["gpu", "cpu"])
    p.add_argument("--steps", type=int, default=8, help="rollout steps")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per step (B)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--out", default="runs/gpu_check")
    a = p.parse_args(argv)

    import lightning as L
    import torch
    from lightning.pytorch.strategies import ModelParallelStrategy

    from lit_rlft import (
        CountdownTask,
        DPSCallback,
        GRPOModule,
        LoRAConfig,
        PromptDataModule,
        ReplayCallback,
        TinyConfig,
    )

    gpu = a.accelerator == "gpu"
    if gpu and not torch.cuda.is_available():
        print("FAIL no CUDA device visible (run with --accelerator cpu for the CPU path)")
        return 1
    print(f"device: {torch.cuda.get_device_name(0) if gpu else 'cpu'}; torch {torch.__version__}")
    checks: list[tuple[str, bool, str]] = []
    tiny = TinyConfig(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.hidden // 64,
                      num_key_value_heads=max(1, a.hidden // 256), intermediate_size=4 * a.hidden, head_dim=64)

    # 1-2. a few steps of the GPU recipe on a small model
    L.seed_everything(0, verbose=False)
    module = GRPOModule(model="tiny", tiny=tiny, lora=LoRAConfig(r=16, alpha=32),
                        reward_funcs=[starts_with_a_digit], num_generations=8,
                        max_completion_length=32, temperature=1.0, loss_type="dr_grpo", scale_rewards="none",
                        learning_rate=1e-4, num_mini_batches=2, micro_batch_size=64)
    data = PromptDataModule(train=CountdownTask(size=5000, num_numbers=[2, 3, 4]), answer_field=None,
                            batch_size=a.batch_size)
    strategy = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1,
                                     process_group_backend="nccl" if gpu else "gloo")
    times: list[tuple[float, float, float]] = []
    before: dict[str, torch.Tensor] = {}

    class Watch(L.Callback):
        def on_fit_start(self, trainer, pl_module):  # after configure_model sharded the policy
            before.update(_full(pl_module.policy))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            m = trainer.callback_metrics
            times.append((float(m["time/step_s"]), float(m["time/generation_share"]), float(m["loss"])))

    trainer = L.Trainer(accelerator=a.accelerator, devices=1, strategy=strategy,
                        precision="bf16-mixed" if gpu else "32-true", max_steps=a.steps * 2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=a.out,
                        callbacks=[DPSCallback(), ReplayCallback(delta=0.5, capacity=128), Watch()])
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer.fit(module, datamodule=data)
    wall = time.perf_counter() - t0
    after = _full(module.policy)
    moved = {n for n in after if not torch.equal(after[n], before[n])}
    lora = {n for n in after if "lora_" in n}
    losses = [loss for _, _, loss in times]
    checks.append(("FSDP2 + LoRA + DPS + replay trains", bool(times) and all(map(_finite, losses)),
                   f"{len(times)} steps in {wall:.1f} s, losses {', '.join(f'{x:.4f}' for x in losses)}"))
    checks.append(("only and all LoRA weights moved", moved == lora,
                   f"{len(moved)} of {len(after)} tensors moved, {len(lora)} LoRA tensors"))
    steady = times[1:] or times
    detail = (f"median step {statistics.median(s for s, _, _ in steady):.3f} s, generation share "
              f"{statistics.median(g for _, g, _ in steady):.2f}")
    if gpu:
        detail += f", peak memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
    checks.append(("step time", True, detail))

    # 3. float32 master weights vs bfloat16 weights under AdamW at lr 1e-6
    from lit_rlft.models.tiny import char_tokenizer, tiny_qwen2

    device = "cuda" if gpu else "cpu"
    fractions = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny_qwen2(char_tokenizer(), tiny).to(device=device, dtype=dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.99))
        ids = torch.randint(3, 90, (8, 64), device=device, generator=torch.Generator(device).manual_seed(0))
        model(input_ids=ids, labels=ids).loss.backward()
        start = [p.detach().clone() for p in model.parameters()]
        opt.step()
        changed = sum(int((p.detach() != s).sum()) for p, s in zip(model.parameters(), start))
        fractions[str(dtype).replace("torch.", "")] = changed / sum(s.numel() for s in start)
    checks.append(("float32 master weights take AdamW's lr 1e-6 updates",
                   fractions["float32"] > 0.9 and fractions["bfloat16"] < fractions["float32"],
                   ", ".join(f"{k}: {v:.1%} of weights changed" for k, v in fractions.items())))

    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


def starts_with_a_digit(completions: list[str], **columns) -> list[float]:
    """A toy reward an untrained policy gets about one time in ten (the first character is a digit, as a Countdown
    answer's often is): groups then have reward variance, so every LoRA matrix receives a gradient."""
    return [1.0 if c[:1].isdigit() else 0.0 for c in completions]


def _full(model) -> dict:
    """Every parameter whole, as float32 on the CPU (FSDP2 shards gathered)."""
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float().cpu().clone()
            for n, p in model.named_parameters()}


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


if __name__ == "__main__":
    sys.exit(main())
