"""Step time of lit_rlft's GRPOModule against TRL's GRPOTrainer on the same tiny policy and the same prompts.

    .venv/bin/python -m pip install "trl>=0.20"            # the bench extra (check torch stays 2.13.0+cpu)
    .venv/bin/python benchmarks/step_time_vs_trl.py --steps 12 --rounds 3 --threads 1
    # a real model, and lit_rlft generating with vLLM (in .venv-vllm, with trl installed there):
    .venv-vllm/bin/python benchmarks/step_time_vs_trl.py --model smollm2-135m-instruct --engine vllm \
        --prompts 4 --generations 4 --max-new-tokens 64 --steps 5 --warmup 1 --rounds 2 --threads 2

Goal: lit_rlft / TRL median step time <= 1.0.

What is compared (both sides in this process, one after the other, alternating in rounds so that a noisy, shared
machine hits both alike):

- the same weights: the tiny Qwen2 (hidden 128, 4 layers, head_dim 64, 1.06M parameters) and character tokenizer
  saved once by ``save_tiny_policy`` and loaded from that directory by both;
- the same prompts in the same order: 16 Countdown prompts per step, taken from lit_rlft's own batch plan; TRL gets
  them as a data set in that order with ``shuffle_dataset=False`` (the script checks that both saw the same ones,
  and that TRL's tokenizer gives lit_rlft's prompt tokens: both load the tokenizer as saved; until 2026-12 TRL's
  side loaded it with ``AutoTokenizer``, which for the tiny model drops the prompts' spaces: 10-token prompts against
  lit_rlft's 13, which flattered TRL's step by about 5%);
- G = 8 completions per prompt, at most 32 new tokens, temperature 1, HF ``generate`` (no vLLM), plain-text prompts;
- one optimizer step per generation batch (``num_iterations=1``, one mini-batch, no gradient accumulation), no KL
  (``beta=0``, no reference model), the same loss aggregation and reward scaling, AdamW (torch, not fused) with
  lr 1e-5, betas (0.9, 0.99), constant schedule, gradient clipping at 1.0; the whole batch of 128 sequences in one
  forward/backward on both sides;
- the same number of torch threads (``--threads``).

A step is timed from the framework's step-begin hook to its step-end hook (Lightning ``on_train_batch_start`` ..
``on_train_batch_end``; TRL ``on_step_begin`` .. ``on_step_end``): generation, reward, log-probs, loss, backward
and the optimizer step, both sides included. ``period`` is the time between consecutive step ends, which adds the
framework's own per-step overhead (data loading, logging). Generation is ``HFEngine.generate`` in lit_rlft (the
module's ``time/generation_s``) and ``GRPOTrainer._generate_single_turn`` in TRL (timed by wrapping it). The
first ``--warmup`` steps of each run are discarded.

The untrained policy samples nearly uniformly over ~100 characters, so EOS (about 1% per token) almost never
stops a whole batch: ``generate`` runs all 32 decoding steps on both sides (the mean completion lengths printed
are the tokens up to the first EOS). All rewards are 0 for the untrained policy: this measures cost, not learning.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
import zlib
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

B, G, MAX_NEW = 16, 8, 32
#: The sides a run can compare: lit_rlft with per-row passes (``shared_prompt: false``), lit_rlft with shared-prompt
#: passes (``shared_prompt: auto``, the default), lit_rlft passing every row (per-row passes,
#: ``skip_zero_advantage: false``: what it did before issue 58), TRL.
SIDES = ("lit", "lit_shared", "lit_all", "trl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12, help="training steps per run (warm-up included)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of [lit_rlft run, TRL run]")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for both")
    p.add_argument("--warmup", type=int, default=2, help="first steps of each run left out")
    p.add_argument("--loss-type", default="dapo", choices=["dapo", "grpo", "dr_grpo"])
    p.add_argument("--scale-rewards", default="group", choices=["group", "batch", "none"])
    p.add_argument("--pool-size", type=int, default=1000, help="Countdown training prompts")
    p.add_argument("--order", default="lit,trl", help="order inside a round: lit,trl or trl,lit")
    p.add_argument("--model", default="tiny", help="'tiny' (built locally), 'smollm2-135m-instruct' or a folder")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="lit_rlft's rollout engine")
    p.add_argument("--prompts", type=int, default=B, help="prompts per step")
    p.add_argument("--generations", type=int, default=G, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=MAX_NEW)
    p.add_argument("--gradient-checkpointing", action="store_true", help="both sides (non-reentrant)")
    p.add_argument("--lora", type=int, default=None, metavar="R",
                   help="LoRA adapters of rank R (alpha 2R, every linear layer, no dropout) on both sides (peft)")
    p.add_argument("--padding-free", action="store_true", help="lit_rlft's packed training passes")
    p.add_argument("--replay-delta", type=float, default=None, help="lit_rlft with ReplayCallback(delta=...)")
    p.add_argument("--hidden", type=int, default=None, help="the tiny model's hidden size (default TinyConfig's)")
    p.add_argument("--layers", type=int, default=None, help="the tiny model's decoder layers")
    p.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--reward", default="countdown", choices=["countdown", "coin", "mixed"],
                   help="countdown (0 for an untrained policy), coin flips (reward variance in almost every group), "
                        "or mixed: --degenerate of the prompts always 0 or always 1, coin flips for the rest")
    p.add_argument("--degenerate", type=float, default=0.6,
                   help="--reward mixed: the share of prompts whose reward never varies (their groups teach nothing)")
    p.add_argument("--bf16", action="store_true", help="bf16-mixed on both sides (GPU)")
    p.add_argument("--prompt-prefix-tokens", type=int, default=0,
                   help="a fixed text of this many characters (tokens, for the tiny model) before every prompt, on "
                        "both sides: a long-prompt step (few-shot or tool instructions)")
    p.add_argument("--no-shared-prefill", action="store_true",
                   help="lit_rlft's HF engine prefills every row (its default prefills each group's prompt once)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "step_time_vs_trl.json"))
    args = p.parse_args(argv)
    if args.steps <= args.warmup:
        p.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    args.order = [s.strip() for s in args.order.split(",")]
    if not args.order or len(set(args.order)) < len(args.order) or set(args.order) - set(SIDES) or (
            len(args.order) > 1 and "trl" not in args.order):
        p.error(f"--order: sides from {', '.join(SIDES)}, each at most once, TRL among them when there are several "
                f"(lit: model.optim.shared_prompt=false, per-row passes; lit_shared: the default, auto; lit_all: per-row "
                f"passes over every row, skip_zero_advantage=false); got {args.order}")
    return args


def quiet() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "transformers", "trl", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def rss_mib() -> float:
    """This process's resident set size now, MiB (Linux)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


class _RSSPeak:
    """The highest resident set size of this process since :meth:`start`, sampled every 10 ms by a thread."""

    def __init__(self) -> None:
        self.base = self.peak = 0.0
        self._stop = None

    def start(self) -> None:
        import threading

        self.stop()
        self.base = self.peak = rss_mib()
        self._stop = threading.Event()

        def sample(stop: threading.Event) -> None:
            while not stop.wait(0.01):
                self.peak = max(self.peak, rss_mib())

        threading.Thread(target=sample, args=(self._stop,), daemon=True).start()

    def stop(self) -> float:
        if self._stop is not None:
            self._stop.set()
            self._stop = None
            self.peak = max(self.peak, rss_mib())
        return self.peak - self.base


_RSS = _RSSPeak()


def reset_peak_memory(args: argparse.Namespace) -> None:
    if args.accelerator == "gpu":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    else:
        _RSS.start()


def peak_memory(args: argparse.Namespace) -> float:
    """MiB the training run added at its peak: CUDA's max allocated during it (GPU); on CPU the rise of the process's
    resident set over what it held when the run started (sampled every 10 ms: model weights already loaded, libraries
    imported), i.e. activations, gradients, optimizer state, generation caches and the framework's own buffers."""
    if args.accelerator == "gpu":
        return torch.cuda.max_memory_allocated() / 2**20
    return _RSS.stop()


def coin_reward(completions: list[str], **columns: Any) -> list[float]:
    """1 with probability 1/2 (torch's generator, re-seeded per step by both frameworks): groups with reward
    variance even for an untrained policy, which replay needs to have anything to replay."""
    return (torch.rand(len(completions)) < 0.5).float().tolist()


#: ``--degenerate``: the share of prompts :func:`mixed_reward` scores with a constant (set by :func:`main`).
DEGENERATE = 0.6


def mixed_reward(completions: list[str], nums: list[Any], target: list[Any], **columns: Any) -> list[float]:
    """A fixed share :data:`DEGENERATE` of the prompts (chosen by a hash of the problem, the same on both sides)
    always scores 0 or always 1, the rest coin flips (:func:`coin_reward`): about that share of the groups has no
    reward variance, as in a real run where most prompts are always or never solved, and the rest have some."""
    coins = coin_reward(completions)
    out = []
    for c, n, t in zip(coins, nums, target):
        h = zlib.crc32(f"{n}|{t}".encode())
        out.append(float(h % 2) if (h >> 1) % 1000 < DEGENERATE * 1000 else c)
    return out


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


# ---------------------------------------------------------------------------------------------------- lit_rlft
def make_datamodule(args: argparse.Namespace):
    from lit_rlft.data import CountdownTask, PromptDataModule

    task = CountdownTask(size=args.pool_size, num_numbers=[2, 3, 4], split="train", seed=0)
    return PromptDataModule(train=task, answer_field=None, batch_size=B, prompt_prefix=prompt_prefix(args))


def prompt_prefix(args: argparse.Namespace) -> str:
    """``--prompt-prefix-tokens`` characters of worked Countdown examples, the same before every prompt."""
    if not args.prompt_prefix_tokens:
        return ""
    shot = "Use each number once to reach the target. 12 7 3>81=(12-3)*9 wrong: 7 is not 9; (12-3)*7+18 no; "
    text = (shot * (args.prompt_prefix_tokens // len(shot) + 1))[: args.prompt_prefix_tokens - 1]
    return text + "\n"


def planned_batches(args: argparse.Namespace, tokenizer: Any) -> list[dict[str, list[Any]]]:
    """The prompts (and reward columns) lit_rlft's default plan gives each step, read through its public API."""
    dm = make_datamodule(args)
    dm.setup("fit")
    dm.set_tokenizer(tokenizer)
    out = []
    for _ in range(args.steps):
        ids = dm.plan.next_batch()
        out.append({"prompt": dm.prompt_texts(ids), **dm.reward_columns(ids), "_tokens": dm.prompt_tokens(ids)})
    return out


def run_lit(args: argparse.Namespace, model_dir: str, plan: list[dict[str, list[Any]]],
            shared_prompt: bool | str = False, skip_zero_advantage: bool = True) -> dict[str, Any]:
    import lightning as L

    from lit_rlft import GenerationConfig, GRPOLoss, GRPOModule, OptimConfig
    from lit_rlft.models.loading import LoRAConfig
    from lit_rlft.rollout import HFEngine

    class Timer(L.Callback):
        def __init__(self) -> None:
            self.step: list[float] = []
            self.ends: list[float] = []
            self.gen: list[float] = []
            self.self_step: list[float] = []
            self.lengths: list[float] = []
            self.skipped: list[float] = []
            self.threads: set[int] = set()
            self.prompts_ok = True
            self._t0 = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.threads.add(torch.get_num_threads())
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            t1 = time.perf_counter()
            self.step.append(t1 - self._t0)
            self.ends.append(t1)
            m = trainer.callback_metrics
            self.gen.append(float(m["time/generation_s"]))
            self.self_step.append(float(m["time/step_s"]))
            self.lengths.append(float(m["completions/mean_length"]))
            self.skipped.append(float(m.get("perf/skipped_rows_share", 0.0)))
            i = len(self.step) - 1
            if i < len(plan) and list(outputs["rollouts"].prompts) != plan[i]["prompt"]:
                self.prompts_ok = False

    engine = HFEngine(shared_prefill=not args.no_shared_prefill)
    if args.engine == "vllm":
        from lit_rlft.rollout.engines.vllm import VLLMEngine

        engine = VLLMEngine(dtype="float32", max_model_len=512)
    module = GRPOModule(
        model=model_dir,
        engine=engine,
        reward_funcs=[{"countdown": "lit_rlft.rewards.countdown_reward", "coin": "benchmarks.step_time_vs_trl.coin_reward",
                       "mixed": "benchmarks.step_time_vs_trl.mixed_reward"}[args.reward]],
        generation=GenerationConfig(num_generations=G, max_completion_length=MAX_NEW, temperature=1.0),
        loss=GRPOLoss(loss_type=args.loss_type, beta=0.0),
        optim=OptimConfig(learning_rate=1e-5, adam_betas=(0.9, 0.99), num_iterations=1, max_grad_norm=1.0,
                          gradient_checkpointing=args.gradient_checkpointing, padding_free=args.padding_free,
                          shared_prompt=shared_prompt, skip_zero_advantage=skip_zero_advantage),
        scale_rewards=args.scale_rewards,
        lora=LoRAConfig(r=args.lora, alpha=2 * args.lora) if args.lora else None,
    )
    timer = Timer()
    callbacks: list[Any] = [timer]
    if args.replay_delta is not None:
        from lit_rlft import ReplayCallback

        callbacks.insert(0, ReplayCallback(delta=args.replay_delta, capacity=4 * B))
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=1,
        precision="bf16-mixed" if args.bf16 else "32-true",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    reset_peak_memory(args)
    trainer.fit(module, datamodule=make_datamodule(args))
    return {
        "step_s": timer.step,
        "period_s": [b - a for a, b in zip(timer.ends, timer.ends[1:])],
        "generation_s": timer.gen,
        "self_reported_step_s": timer.self_step,
        "mean_completion_length": timer.lengths,
        "skipped_rows_share": timer.skipped,
        "threads_seen": sorted(timer.threads),
        "prompts_match_plan": (timer.prompts_ok or args.replay_delta is not None) and len(timer.step) == args.steps,
        "peak_memory_mib": peak_memory(args),
    }


# ---------------------------------------------------------------------------------------------------- TRL
def run_trl(args: argparse.Namespace, model_dir: str, plan: list[dict[str, list[Any]]], out_dir: str) -> dict[str, Any]:
    import datasets
    import transformers
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from lit_rlft.models.loading import load_tokenizer_for
    from lit_rlft.rewards import countdown_reward

    # lit_rlft's reward columns include "prompts" (the rendered texts); TRL passes its own ``prompts``.
    rows = [{k: batch[k][j] for k in batch if k not in ("prompts", "_tokens")} for batch in plan for j in range(B)]
    dataset = datasets.Dataset.from_list(rows)
    seen_prompts: list[list[str]] = []

    def countdown(completions, prompts, nums, target, **kwargs):
        seen_prompts.append(list(prompts[::G]))  # rows arrive grouped: G copies of each prompt in a row
        if args.reward == "coin":
            return coin_reward(completions)
        if args.reward == "mixed":
            return mixed_reward(completions, nums, target)
        return countdown_reward(completions, nums, target)

    countdown.__name__ = "countdown_reward"

    class Timer(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.step: list[float] = []
            self.ends: list[float] = []
            self.lengths: list[float] = []
            self.threads: set[int] = set()
            self._t0 = 0.0

        def on_step_begin(self, a, state, control, **kw):
            self.threads.add(torch.get_num_threads())
            self._t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            t1 = time.perf_counter()
            self.step.append(t1 - self._t0)
            self.ends.append(t1)

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    cfg = GRPOConfig(
        output_dir=out_dir,
        # TRL counts per_device_train_batch_size in completions (rows), not prompts: 16 prompts x 8 = 128 rows.
        per_device_train_batch_size=B * G,
        gradient_accumulation_steps=1,  # => steps_per_generation = 1: generate every optimizer step
        num_generations=G,
        max_completion_length=MAX_NEW,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=1e-5,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        optim="adamw_torch",  # TRL's default on torch >= 2.8 is adamw_torch_fused; lit_rlft uses plain AdamW
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        loss_type=args.loss_type,
        scale_rewards=args.scale_rewards,
        use_vllm=False,
        shuffle_dataset=False,  # the rows already are lit_rlft's plan, in order
        report_to=[],
        logging_steps=1,
        max_steps=args.steps,
        bf16=args.bf16,
        use_cpu=args.accelerator == "cpu",
        gradient_checkpointing=args.gradient_checkpointing,  # TRL's default is True: set on both sides alike
        gradient_checkpointing_kwargs={"use_reentrant": False},
        save_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # The tokenizer as saved (lit_rlft's loader): AutoTokenizer would pick Qwen2Tokenizer from config.json for the
    # tiny model, whose pre-tokenizer drops the spaces of character-level prompts (10 tokens where lit_rlft has 13).
    tok = load_tokenizer_for(model_dir)
    same_tokens = all(tok(text, add_special_tokens=False)["input_ids"] == list(ids)
                      for batch in plan for text, ids in zip(batch["prompt"], batch["_tokens"]))
    timer = Timer()
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
    trainer = GRPOTrainer(
        model=model, reward_funcs=[countdown], args=cfg, train_dataset=dataset, processing_class=tok,
        callbacks=[timer], peft_config=peft_config,
    )
    trainer.remove_callback(transformers.PrinterCallback)  # with disable_tqdm it prints every log dict
    assert trainer.args.steps_per_generation == 1 and trainer.args.generation_batch_size == B * G, (
        trainer.args.steps_per_generation, trainer.args.generation_batch_size)
    gen: list[float] = []
    generate_single_turn = trainer._generate_single_turn

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        out = generate_single_turn(*a, **kw)
        gen.append(time.perf_counter() - t0)
        return out

    trainer._generate_single_turn = timed_generate  # instance attribute shadows the method
    torch.set_num_threads(args.threads)  # in case anything in set-up changed it
    reset_peak_memory(args)
    trainer.train()
    return {
        "step_s": timer.step,
        "period_s": [b - a for a, b in zip(timer.ends, timer.ends[1:])],
        "generation_s": gen,
        "mean_completion_length": timer.lengths,
        "threads_seen": sorted(timer.threads),
        "prompts_match_plan": seen_prompts == [p["prompt"] for p in plan] and same_tokens,
        "optimizer": type(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer).__name__,
        "peak_memory_mib": peak_memory(args),
    }


# ---------------------------------------------------------------------------------------------------- report
def summarise(run: dict[str, Any], warmup: int) -> dict[str, Any]:
    steps = run["step_s"][warmup:]
    gen = run["generation_s"][warmup:]
    periods = run["period_s"][max(0, warmup - 1):]  # period i ends at step i+1
    share = [g / s for g, s in zip(gen, steps)] if len(gen) == len(steps) else []
    lengths = run["mean_completion_length"][warmup:]
    return {
        "median_step_s": median(steps),
        "min_step_s": min(steps) if steps else float("nan"),
        "median_period_s": median(periods),
        "median_generation_s": median(gen),
        "median_generation_share": median(share),
        "mean_completion_length": float(statistics.mean(lengths)) if lengths else float("nan"),
        "n": len(steps),
    }


def main(argv: list[str] | None = None) -> int:
    global B, G, MAX_NEW, DEGENERATE  # the sizes every function reads
    args = parse_args(argv)
    B, G, MAX_NEW, DEGENERATE = args.prompts, args.generations, args.max_new_tokens, args.degenerate
    quiet()
    torch.set_num_threads(args.threads)

    import transformers

    from lit_rlft.models.loading import load_tokenizer_for, resolve_model_path
    from lit_rlft.models.tiny import TinyConfig, save_tiny_policy
    from lit_rlft.records.jsonio import write_result

    work = tempfile.mkdtemp(prefix="step_time_vs_trl_")
    if args.model == "tiny":
        size = {k: v for k, v in (("hidden_size", args.hidden), ("num_hidden_layers", args.layers)) if v}
        size["max_position_embeddings"] = max(256, 2 * (args.prompt_prefix_tokens + 16 + args.max_new_tokens))
        if args.hidden:
            size.update(intermediate_size=4 * args.hidden, num_attention_heads=max(1, args.hidden // 64),
                        num_key_value_heads=max(1, args.hidden // 64))
        model_dir = str(save_tiny_policy(Path(work) / "tiny", TinyConfig(**size)))
    else:
        model_dir = resolve_model_path(args.model)
    plan = planned_batches(args, load_tokenizer_for(model_dir))
    n_params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_pretrained(model_dir).parameters())

    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        entry: dict[str, Any] = {"round": r + 1}
        for side in args.order:
            torch.set_num_threads(args.threads)
            t0 = time.perf_counter()
            if side != "trl":
                raw = run_lit(args, model_dir, plan, shared_prompt="auto" if side == "lit_shared" else False,
                              skip_zero_advantage=side != "lit_all")
            else:
                raw = run_trl(args, model_dir, plan, str(Path(work) / f"trl_{r}"))
            raw["wall_s"] = time.perf_counter() - t0
            entry[side] = {"summary": summarise(raw, args.warmup), "raw": raw}
            s = entry[side]["summary"]
            print(f"round {r + 1} {side:>3}: median step {s['median_step_s']:.3f} s "
                  f"(period {s['median_period_s']:.3f} s, generation {s['median_generation_s']:.3f} s, "
                  f"share {s['median_generation_share']:.2f}), run wall {raw['wall_s']:.1f} s", flush=True)
        rounds.append(entry)

    def pooled(side: str, key: str) -> list[float]:
        out: list[float] = []
        for e in rounds:
            raw = e[side]["raw"]
            if key == "period_s":
                out += raw[key][max(0, args.warmup - 1):]
            else:
                out += raw[key][args.warmup:]
        return out

    overall: dict[str, Any] = {}
    for side in args.order:
        steps, gen = pooled(side, "step_s"), pooled(side, "generation_s")
        overall[side] = {
            "median_step_s": median(steps),
            "median_period_s": median(pooled(side, "period_s")),
            "median_generation_s": median(gen),
            "median_generation_share": median([g / s for g, s in zip(gen, steps)]),
            "median_of_round_medians_s": median([e[side]["summary"]["median_step_s"] for e in rounds]),
            "n_steps": len(steps),
            "peak_memory_mib": max(e[side]["raw"]["peak_memory_mib"] for e in rounds),
        }
    if len(args.order) == 1:  # one side alone (a fresh process per side: its peak memory is that side's)
        side = args.order[0]
        result = {"command": "python benchmarks/step_time_vs_trl.py " + " ".join(sys.argv[1:] if argv is None
                                                                                  else argv),
                  "side": side, "overall": overall[side], "n_parameters": n_params,
                  "rounds": [e[side]["summary"] for e in rounds]}
        write_result(args.out, result)
        print(json.dumps(overall[side]))
        return 0
    lits = [side for side in args.order if side != "trl"]
    ratios = {side: overall[side]["median_step_s"] / overall["trl"]["median_step_s"] for side in lits}
    ratios_period = {side: overall[side]["median_period_s"] / overall["trl"]["median_period_s"] for side in lits}
    round_ratios = {side: [e[side]["summary"]["median_step_s"] / e["trl"]["summary"]["median_step_s"]
                           for e in rounds] for side in lits}
    names = {"lit": "lit_rlft", "lit_shared": "lit_rlft shared prompt", "lit_all": "lit_rlft every row", "trl": "TRL"}
    sides = lits + ["trl"]
    lines = [
        "| round | " + " | ".join(f"{names[x]} step (s)" for x in sides) + " | "
        + " | ".join(f"ratio {names[x]} / TRL" for x in lits) + " | "
        + " | ".join(f"{names[x]} generation (s, share)" for x in sides) + " |",
        "|---" * (1 + 2 * len(sides) + len(lits)) + "|",
    ]

    def row(label: str, summaries: list[dict[str, Any]], ratio_cells: list[float], bold: bool = False) -> str:
        b = "**" if bold else ""
        return (f"| {label} | " + " | ".join(f"{b}{x['median_step_s']:.3f}{b}" for x in summaries) + " | "
                + " | ".join(f"{b}{r:.2f}{b}" for r in ratio_cells) + " | "
                + " | ".join(f"{x['median_generation_s']:.3f} ({x['median_generation_share']:.2f})" for x in summaries)
                + " |")

    for i, e in enumerate(rounds):
        lines.append(row(str(e["round"]), [e[x]["summary"] for x in sides], [round_ratios[x][i] for x in lits]))
    counts = " + ".join(str(overall[x]["n_steps"]) for x in sides)
    lines.append(row(f"**all** ({counts} steps)", [overall[x] for x in sides], [ratios[x] for x in lits], bold=True))
    lines.append("| period (step end to step end) | " + " | ".join(f"{overall[x]['median_period_s']:.3f}" for x in sides)
                 + " | " + " | ".join(f"{ratios_period[x]:.2f}" for x in lits) + " |" + " |" * len(sides))
    table = "\n".join(lines)
    lengths = {x: statistics.mean(e[x]["summary"]["mean_completion_length"] for e in rounds) for x in sides}
    prompts_ok = all(e[x]["raw"]["prompts_match_plan"] for e in rounds for x in sides)
    threads = sorted({t for e in rounds for x in sides for t in e[x]["raw"]["threads_seen"]})
    prompt_tokens = statistics.mean(len(t) for batch in plan for t in batch["_tokens"])
    print()
    print(table)
    print()
    for x in lits:
        print(f"ratio {names[x]} / TRL (median step): {ratios[x]:.3f}; per round: "
              f"{', '.join(f'{r:.2f}' for r in round_ratios[x])}")
    skipped = {x: statistics.mean(v for e in rounds for v in e[x]["raw"]["skipped_rows_share"][args.warmup:])
               for x in lits if any(e[x]["raw"]["skipped_rows_share"][args.warmup:] for e in rounds)}
    print("rows the update left out (groups whose advantages are all 0): "
          + ", ".join(f"{names[x]} {skipped[x]:.0%}" for x in skipped))
    print(f"same prompts on both sides, every step: {prompts_ok}; torch threads seen in steps: {threads}")
    print("mean completion length up to the first EOS: " + ", ".join(f"{names[x]} {lengths[x]:.1f}" for x in sides)
          + f" (max {MAX_NEW} new tokens, {B * G} completions per step, prompts of {prompt_tokens:.0f} tokens)")

    result = {
        "command": "python benchmarks/step_time_vs_trl.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "config": {
            "prompts_per_step": B, "num_generations": G, "max_completion_length": MAX_NEW, "temperature": 1.0,
            "learning_rate": 1e-5, "beta": 0.0, "num_iterations": 1, "loss_type": args.loss_type, "lora_r": args.lora,
            "reward": args.reward, "degenerate": args.degenerate if args.reward == "mixed" else None,
            "scale_rewards": args.scale_rewards, "steps": args.steps, "warmup_discarded": args.warmup,
            "rounds": args.rounds, "order": args.order, "threads": args.threads, "pool_size": args.pool_size,
            "model": (f"tiny Qwen2 (lit_rlft.models.tiny.TinyConfig()), {n_params} parameters, float32"
                      if args.model == "tiny" else f"{args.model}, {n_params} parameters, float32"),
            "lit_rlft_engine": args.engine, "lit_rlft_shared_prefill": not args.no_shared_prefill,
            "prompt_prefix_tokens": args.prompt_prefix_tokens, "mean_prompt_tokens": prompt_tokens,
            "trl_optimizer": rounds[0]["trl"]["raw"]["optimizer"],
        },
        "load_avg_at_end": os.getloadavg(),
        "same_prompts": prompts_ok,
        "threads_seen": threads,
        "mean_completion_length": lengths,
        "skipped_rows_share": skipped,
        "overall": overall,
        "ratio_over_trl": ratios,
        "ratio_over_trl_period": ratios_period,
        "round_ratios": round_ratios,
        "rounds": rounds,
        "table_markdown": table,
    }
    out = write_result(args.out, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
