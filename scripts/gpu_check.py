"""A check of lit_rlft on a machine with one NVIDIA GPU in under 8 minutes (no network needed).

    python scripts/gpu_check.py                       # GPU: every check below
    python scripts/gpu_check.py --accelerator cpu     # checks 1-3 on the CPU (gloo), as a smoke test

It trains a locally built, untrained Qwen2 (hidden 512, 8 layers, ~30M parameters, character tokenizer) on Countdown
prompts for a few GRPO steps, rewarded for starting its answer with a digit (an untrained policy does that about one
time in ten, which gives groups reward variance), and checks, printing one line per check:

1. the run trains under ``ModelParallelStrategy`` (FSDP2) with LoRA, ``precision: bf16-mixed``, float32 master
   weights, gradient checkpointing and packed training passes, DPS choosing the fresh half of each batch and replay
   the rest: finite losses, every LoRA matrix moved, no base weight moved;
2. step time, generation share and peak GPU memory (from the run's own metrics);
3. why the recipe keeps float32 master weights: one AdamW step at lr 1e-6 on the same weights in float32 and in
   bfloat16, and the fraction of weights each step changed;
4. (GPU, with ``trl`` importable) ``benchmarks/memory_throughput.py --parts trl,replay`` on a 0.5B-bodied random
   Qwen2 (hidden 896, 24 layers), 16 prompts x 8 completions of 128 tokens, bf16: lit_rlft against TRL's
   ``GRPOTrainer`` with checkpointing on both sides and off on both (each side in its own process: peak memory,
   step time, generation share), and uniform against replay ``delta=0.5``. Goals: lit_rlft's peak memory at most
   TRL's, its step time at most 0.9x TRL's;
5. (GPU, with ``../shared/data/math``) two rollout steps of ``configs/math_qwen2.5-math-1.5b.yaml`` with DPS +
   replay through the command line, on a 1.3B-shaped random policy (hidden 1536, 28 layers) at a quarter of the
   recipe's batch and 256 new tokens;
6. asynchronous rollouts at depth 1 against depth 0 (``benchmarks/async_depth.py``, the check's model): the generation
   process on the second GPU when there is one, sharing the first otherwise (the CPU path: one thread each); every
   step's loss finite, staleness 1 from the second step on; steps per second of both depths reported;
7. a reward model on the GPU (``RewardModel``, bf16): a random Qwen2 sequence classifier of the check's size scores 512
   texts of 32-512 tokens in micro-batches of 16,384 tokens against one text at a time (goal: >= 10x), the scores
   agree with one-at-a-time forwards (bf16 tolerance), and peak memory grows with the token budget (4,096 /
   16,384 / every text in one padded forward, TRL's way);
8. (GPU, with vLLM importable) a generation server: one ``lit-rlft serve`` server (``VLLMServer``) of the check's model
   on the last GPU, three GRPO steps at depth 1 with ``ServerEngine`` (weights pushed over NCCL when the server has a
   GPU of its own, over gloo into host memory when it shares the trainer's: NCCL refuses two ranks on one GPU):
   finite losses, rows one step stale, the server's version equal to the step's, and the push time per step;
9. shared-prompt passes (``model.optim.shared_prompt``) on the GPU's attention kernels: one update of the check's model
   over 8 groups of 8 completions (prompts of 256 tokens, completions of 64; the CPU path: 64 and 16) per-row and
   shared-prompt, in float32 (SDPA with the 4-D block mask, which runs PyTorch's memory-efficient kernel on a GPU:
   the flash kernel takes no mask): the loss and every gradient equal within 1e-4 relative (GPU matmuls reduce in
   other orders than the CPU's 1e-5), and the update's time and peak memory against per-row (goal: time <= 0.6x);
   on a GPU also with ``attn_implementation="flex_attention"``, whose ``BlockMask`` kernel skips the blocks no
   query attends in (FlexAttention has no backward on a CPU);
10. chunked log-probs (``model.optim.logprob_chunk_tokens``) at a real vocabulary: one update of a Qwen2 of the
   check's body with Qwen2's 151,936-token vocabulary over 8 completions of 2,048 tokens (the CPU path: 4 of 128,
   chunks of 64), full logits against ``auto`` chunks (441 positions), bf16 autocast on a GPU: the loss and every
   gradient equal within 1e-2 relative on a GPU (bf16 logits rounded per chunk against whole) and 1e-5 on the CPU,
   and the update's peak memory against the full logits' (goal: <= 0.5x on a GPU).

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
    p.add_argument("--skip-compare", action="store_true", help="GPU: skip checks 4 and 5")
    p.add_argument("--out", default="runs/gpu_check")
    a = p.parse_args(argv)

    import lightning as L
    import torch
    from lightning.pytorch.strategies import ModelParallelStrategy

    from lit_rlft import (
        CountdownTask,
        DPSCallback,
        GenerationConfig,
        GRPOLoss,
        GRPOModule,
        LoRAConfig,
        OptimConfig,
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
    module = GRPOModule(model="tiny", tiny=tiny, lora=LoRAConfig(r=16, alpha=32), reward_funcs=[starts_with_a_digit],
                        generation=GenerationConfig(num_generations=8, max_completion_length=32, temperature=1.0),
                        loss=GRPOLoss(loss_type="dr_grpo"), scale_rewards="none",
                        optim=OptimConfig(learning_rate=1e-4, num_mini_batches=2, micro_batch_size=64,
                                          gradient_checkpointing=True, padding_free=True))
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
    checks.append(("FSDP2 + LoRA + checkpointing + packing + DPS + replay trains", bool(times) and all(map(_finite, losses)),
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

    if gpu and not a.skip_compare:
        checks += compare_with_trl(a.out)
        checks += math_recipe_steps(a.out)
    checks += async_depth_check(a, gpu)
    checks += reward_model_check(tiny, gpu)
    checks += server_check(a, tiny, gpu)
    checks += shared_prompt_check(tiny, gpu)
    checks += chunked_logprobs_check(tiny, gpu)

    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


def compare_with_trl(out: str) -> list[tuple[str, bool, str]]:
    """Check 4: ``benchmarks/memory_throughput.py --parts trl,replay`` on the GPU (skipped without trl)."""
    import importlib.util
    import json
    import subprocess

    if importlib.util.find_spec("trl") is None:
        return [("memory and step time against TRL", True, "skipped: trl is not installed")]
    result = Path(out) / "memory_throughput_gpu.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "memory_throughput.py"), "--accelerator", "gpu", "--bf16",
           "--parts", "trl,replay", "--repeats", "1", "--hidden", "896", "--layers", "24", "--prompts", "16",
           "--generations", "8", "--max-new-tokens", "128", "--steps", "3", "--out", str(result)]
    subprocess.run(cmd, check=True, cwd=REPO)
    r = json.loads(result.read_text())
    checks = []
    for ckpt in ("on", "off"):
        t = r["trl"][f"checkpointing_{ckpt}"]
        detail = (f"lit_rlft {t['lit']['median_step_s']:.2f} s, {t['lit']['peak_memory_mib'] / 1024:.2f} GiB, "
                  f"generation {t['lit']['median_generation_share']:.2f}; TRL {t['trl']['median_step_s']:.2f} s, "
                  f"{t['trl']['peak_memory_mib'] / 1024:.2f} GiB, generation {t['trl']['median_generation_share']:.2f}"
                  f"; step ratio {t['step_ratio_lit_over_trl']:.2f}, memory ratio {t['memory_ratio_lit_over_trl']:.2f}")
        checks.append((f"vs TRL, checkpointing {ckpt} on both: memory <= TRL's, step <= 0.9x",
                       t["memory_ratio_lit_over_trl"] <= 1.0 and t["step_ratio_lit_over_trl"] <= 0.9, detail))
    rp = r["replay"]
    checks.append(("uniform vs replay delta=0.5", True,
                   f"uniform {rp['uniform']['median_step_s']:.2f} s, replay {rp['replay']['median_step_s']:.2f} s "
                   f"(ratio {rp['step_ratio_replay_over_uniform']:.2f})"))
    return checks


def math_recipe_steps(out: str) -> list[tuple[str, bool, str]]:
    """Check 5: two rollout steps of the MATH recipe through the CLI on a 1.3B-shaped random policy."""
    import subprocess

    data = REPO.parent / "shared" / "data" / "math"
    if not data.exists():
        return [("MATH recipe, 1.3B-shaped policy", True, f"skipped: no MATH data at {data}")]
    tiny = ("{hidden_size: 1536, num_hidden_layers: 28, num_attention_heads: 12, num_key_value_heads: 2, "
            "intermediate_size: 8960, head_dim: 128}")
    cmd = [sys.executable, "-m", "lit_rlft.cli", "fit", "--config", "configs/math_qwen2.5-math-1.5b.yaml",
           "--config", "configs/strategies/paper_dps_replay.yaml", "--model.model", "tiny", "--model.tiny", tiny,
           "--data.batch_size", "16", "--model.generation.max_completion_length", "256", "--trainer.max_steps", "8",
           "--trainer.val_check_interval", "1000", "--trainer.default_root_dir", f"{out}/math",
           "--trainer.logger", "false", "--trainer.enable_checkpointing", "false"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    detail = f"{time.perf_counter() - t0:.0f} s; " + (done.stdout + done.stderr).strip().splitlines()[-1][:200]
    return [("MATH recipe, 1.3B-shaped policy, 2 rollout steps", done.returncode == 0, detail)]


def async_depth_check(a: argparse.Namespace, gpu: bool) -> list[tuple[str, bool, str]]:
    """Check 6: ``benchmarks/async_depth.py`` at depths 0 and 1 on the check's model."""
    import json
    import math
    import subprocess

    out = Path(a.out) / "async_depth.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "async_depth.py"), "--hidden", str(a.hidden), "--layers",
           str(a.layers), "--prompts", "8", "--steps", "6", "--warmup", "2", "--rounds", "1", "--out", str(out)]
    if gpu:
        cmd += ["--device", "cuda", "--max-new-tokens", "128"]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        return [("async depth 1 trains", False, (result.stdout + result.stderr).strip().splitlines()[-1][:300])]
    data = json.loads(out.read_text())
    deep = next(r for r in data["runs"] if r["depth"] == 1)
    stale = [m["async/staleness/max"] for m in deep["metrics"]]
    ok = all(math.isfinite(m["loss"]) for m in deep["metrics"]) and stale[0] == 0 and all(s == 1 for s in stale[1:])
    pooled = data["pooled_median_step_s"]
    return [("async depth 1 trains, one step stale", ok,
             f"staleness per step {stale}; median step {pooled['0']:.3f} s at depth 0, {pooled['1']:.3f} s at depth 1 "
             f"({pooled['0'] / pooled['1']:.2f}x), generation share of the synchronous step "
             f"{data['generation_share']:.2f}")]


def server_check(a: argparse.Namespace, tiny, gpu: bool) -> list[tuple[str, bool, str]]:
    """Check 8: a vLLM server on a GPU, fed and synced by ``ServerEngine`` at depth 1 (skipped without vLLM)."""
    import importlib.util
    import math
    import tempfile

    import torch

    if not gpu or importlib.util.find_spec("vllm") is None:
        return [("generation server, depth 1", True, "skipped: needs a GPU and vLLM (pip install 'lit_rlft[vllm]')")]
    from lit_rlft import (
        AsyncConfig,
        CountdownTask,
        GenerationConfig,
        GRPOConfig,
        OptimConfig,
        PromptDataModule,
        build_step,
    )
    from lit_rlft.models.export import save_hf_checkpoint
    from lit_rlft.models.tiny import char_tokenizer, tiny_qwen2
    from lit_rlft.rollout import ServerEngine, VLLMServer
    from lit_rlft.step import TorchBackend, train
    from lit_rlft.step.optim import configure_adamw

    gpus = torch.cuda.device_count()
    folder = tempfile.mkdtemp(prefix="lit_rlft_gpu_check_server_")
    tok = char_tokenizer()
    save_hf_checkpoint(tiny_qwen2(tok, tiny), folder)
    tok.save_pretrained(folder)
    backend = "nccl" if gpus > 1 else "gloo"
    server = VLLMServer(folder, port=0, device="cuda", dtype="float32", gpu_memory_utilization=0.3,
                        env={"CUDA_VISIBLE_DEVICES": str(gpus - 1)})
    try:
        server.start()
        engine = ServerEngine([server.url], rendezvous="127.0.0.1:0", sync_token=server.sync_token, backend=backend)
        config = GRPOConfig(model="tiny", tiny=tiny, engine=engine, reward_funcs=["lit_rlft.rewards.countdown_reward"],
                            generation=GenerationConfig(num_generations=8, max_completion_length=64),
                            asynchronous=AsyncConfig(depth=1),
                            optim=OptimConfig(learning_rate=1e-5))
        step = build_step(config)
        step.policy.to("cuda:0")
        data = PromptDataModule(train=CountdownTask(size=500, split="train"), answer_field=None, batch_size=16)
        data.setup("fit")
        step.bind(data)
        opt = configure_adamw(step.policy, step.optim, total_steps=None)
        outs = []
        for out in train(step, TorchBackend(step.policy, opt["optimizer"], opt["lr_scheduler"]["scheduler"])):
            outs.append(out)
            if len(outs) == 3:
                break
    except Exception as exc:  # reported as a failed check, with the server's log
        return [("generation server, depth 1", False, f"{type(exc).__name__}: {str(exc)[:300]} {server.log_tail(5)}")]
    finally:
        server.stop()
    stale = [o.metrics["async/staleness/max"] for o in outs]
    ok = all(math.isfinite(o.metrics["loss"]) for o in outs) and stale == [0, 1, 1] and \
        engine.version == step.rollout_step
    sync = [round(o.metrics["time/weight_sync_s"], 3) for o in outs]
    return [("generation server, depth 1", ok, f"{backend} sync ({gpus} GPU(s)); staleness {stale}; push s per step "
             f"{sync}; step s {[round(o.metrics['time/step_s'], 2) for o in outs]}")]


def reward_model_check(tiny, gpu: bool) -> list[tuple[str, bool, str]]:
    """Check 7: ``RewardModel`` batched by tokens against one text at a time, and peak memory per token budget."""
    import torch

    from lit_rlft.models.tiny import char_tokenizer, tiny_reward_model
    from lit_rlft.rewards import RewardModel

    device = "cuda" if gpu else "cpu"
    dtype = "bfloat16" if gpu else "float32"
    tok = char_tokenizer()
    module = tiny_reward_model(tok, tiny)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(32, 513 if gpu else 129, (512,), generator=gen).tolist()
    rows = [torch.randint(3, 90, (n,), generator=gen).tolist() for n in lengths]
    reward = RewardModel(module, tok, max_batch_tokens=16384, device=device, dtype=dtype)

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    reward.forward_ids(rows[:8])  # warm-up
    sync()
    t0 = time.perf_counter()
    batched = reward.forward_ids(rows)
    sync()
    t_batched = time.perf_counter() - t0
    single = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        for row in rows:
            single.append(float(reward.model(input_ids=torch.tensor([row], device=device)).logits[0, 0]))
    sync()
    t_single = time.perf_counter() - t0
    err = max(abs(a - b) for a, b in zip(batched.tolist(), single))
    scale = max(abs(b) for b in single) or 1.0
    peaks = {}
    if gpu:
        for budget in (4096, 16384, 10**9):
            reward.max_batch_tokens = budget
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            reward.forward_ids(rows)
            peaks["all" if budget == 10**9 else budget] = (torch.cuda.max_memory_allocated() - base) / 2**20
    ratio = t_single / t_batched
    # the speed goal is the GPU's; on a CPU (a smoke test, often on a shared machine) the ratio is reported only
    ok = (ratio >= 10 or not gpu) and err <= (0.05 if gpu else 1e-4) * scale and (
        not peaks or peaks[4096] < peaks[16384] < peaks["all"])
    memory = ", ".join(f"{k}: {v:.0f} MiB" for k, v in peaks.items())
    return [("reward model batched by tokens", ok,
             f"512 texts ({sum(lengths)} tokens): {t_batched:.2f} s batched, {t_single:.2f} s one at a time "
             f"({ratio:.1f}x); largest difference {err:.3g} (scores up to {scale:.3g})"
             + (f"; peak memory over the weights by token budget: {memory}" if memory else ""))]


def shared_prompt_check(tiny, gpu: bool) -> list[tuple[str, bool, str]]:
    """Check 9: one update per-row and with shared-prompt passes: equal gradients, time and peak memory."""
    import torch

    from lit_rlft.core.losses import GRPOLoss
    from lit_rlft.core.types import Rollouts
    from lit_rlft.models.tiny import char_tokenizer, tiny_qwen2
    from lit_rlft.step import TorchBackend
    from lit_rlft.step.update import PolicyUpdater

    device = "cuda" if gpu else "cpu"
    B, G, P, C = (8, 8, 256, 64) if gpu else (4, 4, 64, 16)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 90, (B, P), generator=gen).repeat_interleave(G, 0)
    lengths = torch.randint(C // 2, C + 1, (B * G,), generator=gen)
    c_mask = (torch.arange(C)[None] < lengths[:, None]).long()
    rewards = torch.randint(0, 2, (B, G), generator=gen).float()
    rollouts = Rollouts(prompt_ids=torch.arange(B), prompt_tokens=prompts, prompt_mask=torch.ones_like(prompts),
                        completion_tokens=torch.randint(3, 90, (B * G, C), generator=gen) * c_mask,
                        completion_mask=c_mask, rewards=rewards, correct=rewards >= 1,
                        birth_step=torch.zeros(B, dtype=torch.long), is_replay=torch.zeros(B, dtype=torch.bool),
                        truncated=lengths == C)
    advantages = (rewards - rewards.mean(1, keepdim=True)).flatten()

    results = {}
    for shared in (False, True, "flex") if gpu else (False, True):
        model = tiny_qwen2(char_tokenizer(), tiny).to(device).train()
        if shared == "flex":  # FlexAttention's BlockMask (no backward on a CPU)
            model.set_attn_implementation("flex_attention")
        captured: dict[str, torch.Tensor] = {}
        backend = TorchBackend(model, _GradientCapture(model, captured))
        updater = PolicyUpdater(GRPOLoss(loss_type="dapo"), 1.0, shared_prompt=bool(shared), micro_batch_size=16)
        times = []
        for _ in range(3):  # the first warms the kernels up
            if gpu:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            out = updater.update(rollouts, advantages, backend)
            if gpu:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated() / 2**20 if gpu else float("nan")
        results[shared] = (statistics.median(times[1:]), peak, dict(captured), float(out.metrics["loss"]))
    t_row, m_row, g_row, l_row = results[False]
    checks = []
    for arm, label in ((True, "sdpa, dense mask"), ("flex", "FlexAttention, block mask")):
        if arm not in results:
            continue
        t_sh, m_sh, g_sh, l_sh = results[arm]
        worst = max(float((g_sh[n] - g_row[n]).norm() / g_row[n].norm().clamp_min(1e-12)) for n in g_row)
        ratio = t_sh / t_row
        ok = worst <= 1e-4 and abs(l_sh - l_row) <= 1e-4 * max(1.0, abs(l_row)) and (ratio <= 0.6 or not gpu)
        memory = f", peak memory {m_sh:.0f} vs {m_row:.0f} MiB" if gpu else ""
        checks.append((f"shared-prompt passes ({label})", ok,
                       f"{B} groups x {G} of {P} + {C} tokens: update {t_sh:.3f} vs {t_row:.3f} s per-row "
                       f"({ratio:.2f}x){memory}; largest relative gradient difference {worst:.1e}, loss {l_sh:.6f} "
                       f"vs {l_row:.6f}"))
    return checks


def chunked_logprobs_check(tiny, gpu: bool) -> list[tuple[str, bool, str]]:
    """Check 10: one update at Qwen2's vocabulary with the full logits and with chunked log-probs: equal gradients,
    peak memory and time."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lit_rlft.core.losses import GRPOLoss
    from lit_rlft.core.types import Rollouts
    from lit_rlft.step import TorchBackend
    from lit_rlft.step.update import PolicyUpdater

    device, vocab = ("cuda" if gpu else "cpu"), 151_936
    B, G, P, C = (4, 2, 64, 2048) if gpu else (2, 2, 16, 128)
    chunk = "auto" if gpu else 64
    gen = torch.Generator().manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=tiny.hidden_size, intermediate_size=tiny.intermediate_size,
                         num_hidden_layers=tiny.num_hidden_layers if gpu else 2,
                         num_attention_heads=tiny.num_attention_heads, num_key_value_heads=tiny.num_key_value_heads,
                         head_dim=tiny.head_dim, tie_word_embeddings=True)
    prompts = torch.randint(3, vocab, (B, P), generator=gen).repeat_interleave(G, 0)
    rewards = torch.tensor([[0.0, 1.0]] * B)
    rollouts = Rollouts(prompt_ids=torch.arange(B), prompt_tokens=prompts, prompt_mask=torch.ones_like(prompts),
                        completion_tokens=torch.randint(3, vocab, (B * G, C), generator=gen),
                        completion_mask=torch.ones(B * G, C, dtype=torch.long), rewards=rewards, correct=rewards >= 1,
                        birth_step=torch.zeros(B, dtype=torch.long), is_replay=torch.zeros(B, dtype=torch.bool),
                        truncated=torch.ones(B * G, dtype=torch.bool))
    advantages = (rewards - rewards.mean(1, keepdim=True)).flatten()
    results = {}
    for side in ("full", "chunked"):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(device).train()
        captured: dict[str, torch.Tensor] = {}
        updater = PolicyUpdater(GRPOLoss(loss_type="dapo"), 1.0, shared_prompt=False,
                                logprob_chunk_tokens=None if side == "full" else chunk)
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=gpu):
            out = updater.update(rollouts, advantages, TorchBackend(model, _GradientCapture(model, captured)))
        if gpu:
            torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20 if gpu else float("nan")
        results[side] = (time.perf_counter() - t0, peak, captured, float(out.metrics["loss"]))
        del model
    (t_full, m_full, g_full, l_full), (t_ch, m_ch, g_ch, l_ch) = results["full"], results["chunked"]
    worst = max(float((g_ch[n] - g_full[n]).norm() / g_full[n].norm().clamp_min(1e-12)) for n in g_full)
    tol = 1e-2 if gpu else 1e-5
    ok = worst <= tol and abs(l_ch - l_full) <= tol * max(1.0, abs(l_full)) and (not gpu or m_ch <= 0.5 * m_full)
    memory = f", peak memory {m_ch:.0f} vs {m_full:.0f} MiB ({m_ch / m_full:.2f}x)" if gpu else ""
    return [("chunked log-probs at vocabulary 151,936", ok,
             f"{B * G} completions of {C} tokens, chunks {chunk}: update {t_ch:.2f} vs {t_full:.2f} s full "
             f"({t_ch / t_full:.2f}x){memory}; largest relative gradient difference {worst:.1e}, loss {l_ch:.6f} vs "
             f"{l_full:.6f}")]


class _GradientCapture:
    """An optimizer that keeps the gradient (float32, on the CPU) instead of stepping."""

    def __init__(self, model, into: dict):
        self.model, self.into = model, into
        self.param_groups = [{"params": list(model.parameters()), "lr": 0.0}]

    def step(self, closure=None) -> None:
        self.into.update({n: p.grad.detach().float().cpu().clone() for n, p in self.model.named_parameters()
                          if p.grad is not None})

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)


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
