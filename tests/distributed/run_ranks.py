"""One multi-process training run for the distributed tests; pytest starts it as a subprocess.

    python tests/distributed/run_ranks.py --out DIR --devices 2 --launcher trainer --strategy ddp \
        --callbacks dps,replay --steps 4

Lightning (or Fabric) starts the other ranks by re-running this script. The Trainer runs a ``GRPOModule``; Fabric runs
``FabricLoop`` over a ``GRPOConfig`` (no LightningModule); the probe is a step callback, so it records both alike. Every rank writes ``DIR/rank<r>.json``:
per step, the prompts it trained on (fresh and replayed), the global batch, the plan for the next step and a digest
of every callback's state; at the end a digest of the parameters. With ``--dump`` it also saves the first step's
rollouts and gradients (``DIR/rank<r>.pt``) for the 1-rank-vs-2-ranks check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning as L  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from tests.distributed.helpers import digest  # noqa: E402

TINY_SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1,
              "intermediate_size": 128, "head_dim": 64}


from lit_rlft.callbacks.base import StepCallback  # noqa: E402


class Probe(StepCallback):
    """Last in the callback list: records what each step trained on and the state every callback ended it with."""

    def __init__(self, out: Path, rank: int, dump: bool):
        self.out, self.rank, self.dump = out, rank, dump
        self.steps: list[dict] = []
        self.grads: dict[str, torch.Tensor] | None = None
        self.rollouts = None
        self.before: dict[str, torch.Tensor] | None = None
        self.after_first: dict[str, torch.Tensor] | None = None
        self.updater_after_first: dict[str, float] | None = None

    def setup_step(self, ctx):
        if self.dump:
            self.before = _full_params(ctx.policy)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):  # the Trainer's hook: --dump runs there
        if self.dump and self.grads is None:
            self.grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
                          for n, p in pl_module.policy.named_parameters() if p.grad is not None}

    def after_step(self, ctx, output):
        r, record = output.rollouts, output.record
        if self.dump and self.rollouts is None:
            self.rollouts, self.after_first = r, _full_params(ctx.policy)
            self.updater_after_first = ctx.updater.state_dict()  # the adaptive entropy coefficient
        scheduled = ctx.data.plan.scheduled
        self.steps.append({
            "fresh": sorted(r.prompt_ids[~r.is_replay].tolist()),
            "replayed": sorted(r.prompt_ids[r.is_replay].tolist()),
            "completions": r.num_completions,  # this rank's real rows (groups of different sizes: per rank)
            "global": sorted(record.trained_batch().prompt_ids.tolist()),
            "observed": sorted(record.fresh().prompt_ids.tolist()),
            "in_flight": sorted(np.asarray(ctx.in_flight).tolist()),  # dispatched during the step, not yet trained
            "scheduled": None if scheduled is None else scheduled.tolist(),
            "plan": digest(ctx.data.state_dict()),
            "callbacks": {type(cb).__name__: digest(cb.state_dict()) for cb in ctx.callbacks
                          if type(cb).__name__ in SELECTION},
            "budget": ctx.budget.completions,
        })

    def finish(self, step) -> None:
        params = _full_params(step.policy)
        result = {"steps": self.steps, "params": digest(params), "rollout_step": step.rollout_step,
                  "budget": step.budget.state_dict(), "reward_totals": step.rollouts.reward_failures.totals,
                  "sharded_rewards": [type(f).__name__ for f in getattr(step.scorer, "funcs", [])
                                      if getattr(f, "sharded", False)],
                  "reward_forwards": [getattr(f, "num_forwards", 0) + getattr(f, "num_padding_forwards", 0)
                                      for f in getattr(step.scorer, "funcs", [])],
                  "last_eval": step.last_validation,
                  "grouped": sorted(set(step.updater._grouped.values()))}  # whether the passes shared prompts
        (self.out / f"rank{self.rank}.json").write_text(json.dumps(result))
        if self.dump:
            torch.save({"rollouts": self.rollouts, "grads": self.grads, "before": self.before,
                        "after_first_step": self.after_first, "after": params,
                        "updater_after_first_step": self.updater_after_first},
                       self.out / f"rank{self.rank}.pt")


def _full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, whole (an FSDP2 shard is gathered: every rank must call this)."""
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


class RaisingEngine:
    """The HF engine, except that rank 1's second generate call raises (before any collective of its own)."""

    def __new__(cls):
        from lit_rlft.rollout.engines.hf import HFEngine

        class _Raising(HFEngine):
            calls = 0

            def generate(self, *args, **kwargs):
                from tests.distributed.helpers import rank

                _Raising.calls += 1
                if rank() == 1 and _Raising.calls == 2:
                    raise RuntimeError("engine boom on rank 1")
                return super().generate(*args, **kwargs)

        return _Raising()


class PlanDrift(StepCallback):
    """Schedules other prompts on rank 1 than on rank 0 after step 0 (a selection state that drifted)."""

    def after_step(self, ctx, output):
        if output.step == 0 and ctx.collective.rank == 1:
            plan = ctx.data.plan
            plan.schedule(list(range(plan.batch_size, 2 * plan.batch_size)), by="drift")


SELECTION = {"DPSCallback", "DOTSCallback", "ReplayCallback", "DynamicSamplingCallback", "HistoryResamplingCallback",
             "ScreeningCallback", "SequentialSamplingCallback", "AllocationCallback"}


def make_callbacks(names: list[str], out: Path) -> list[L.Callback]:
    from lit_rlft.callbacks import (
        AllocationCallback,
        AutoShareCallback,
        DOTSCallback,
        DPSCallback,
        DynamicSamplingCallback,
        ReplayCallback,
        ScreeningCallback,
        SequentialSamplingCallback,
    )

    made = {
        "dps": lambda: DPSCallback(decay=0.5),
        "replay": lambda: ReplayCallback(delta=0.5, capacity=16),
        "dots": lambda: DOTSCallback(reference_size=6, update_every=2, online_steps_per_update=2,
                                     cache_dir=str(out / "emb")),
        "ds": lambda: DynamicSamplingCallback(max_rounds=3),
        "screen": lambda: ScreeningCallback(initial_generations=2, max_rounds=3),
        "alloc": lambda: AllocationCallback(min_generations=1, max_generations=6, budget_ratio=1.25, granularity=1,
                                            min_gain=0.0),
        "seq": lambda: SequentialSamplingCallback(initial_generations=1, round_generations=1, max_generations=4),
        "auto": lambda: AutoShareCallback(rate=1.0),
        "drift": PlanDrift,
    }
    return [made[n]() for n in names if n]


def _option(text: str) -> tuple[str, object]:
    """``key=value`` -> (key, bool / float / str value)."""
    key, value = text.split("=", 1)
    if value in ("true", "false"):
        return key, value == "true"
    try:
        return key, float(value)
    except ValueError:
        return key, value


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--launcher", choices=["trainer", "fabric"], default="trainer")
    p.add_argument("--strategy", choices=["ddp", "fsdp2"], default="ddp")
    p.add_argument("--callbacks", default="")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--pool", type=int, default=48)
    p.add_argument("--lora", action="store_true")
    p.add_argument("--reward", default="tests.distributed.helpers.coin_reward")
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--resume", default=None)
    p.add_argument("--dump", action="store_true")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--micro-batch-tokens", type=int, default=None)
    p.add_argument("--padding-free", action="store_true")
    p.add_argument("--shared-prompt", action="store_true", help="model.optim.shared_prompt: true")
    p.add_argument("--logprob-chunk-tokens", type=int, default=None, help="model.optim.logprob_chunk_tokens")
    p.add_argument("--loss", default="", help="GRPOLoss options, key=value,key=value")
    p.add_argument("--val", type=int, default=0, help="held-out prompts, evaluated every 2 steps (0: none)")
    p.add_argument("--engine", choices=["hf", "vllm", "raise-on-rank-1", "servers"], default="hf")
    p.add_argument("--servers", default="", help="--engine servers: the stand-in servers, host:port,host:port")
    p.add_argument("--async-depth", type=int, default=0, help="model.asynchronous.depth")
    p.add_argument("--env", choices=["none", "echo", "echo-rank0-stops"], default="none",
                   help="echo: multi-turn episodes with tests.distributed.helpers.EchoEnv (2 turns); echo-rank0-stops: "
                        "rank 0's episodes all end after one turn")
    p.add_argument("--generation-batch-size", type=int, default=None, help="HFEngine(max_batch_size=...)")
    a = p.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    from lit_rlft import (
        AsyncConfig,
        GenerationConfig,
        GRPOConfig,
        GRPOLoss,
        GRPOModule,
        LoRAConfig,
        OptimConfig,
        PromptDataModule,
        TinyConfig,
    )
    from lit_rlft.data import CountdownTask

    L.seed_everything(0, verbose=False)
    engine = None
    if a.engine == "vllm":
        from lit_rlft.rollout.engines.vllm import VLLMEngine

        engine = VLLMEngine(dtype="float32", max_model_len=64, kv_cache_memory_bytes=32 * 2**20)
    elif a.engine == "raise-on-rank-1":
        engine = RaisingEngine()
    elif a.engine == "servers":  # stand-in servers of the test (tests/rollout/servers/fake_servers.py)
        from lit_rlft.rollout import ServerEngine

        engine = ServerEngine(a.servers.split(","), timeout_s=30.0)
    elif a.generation_batch_size:
        from lit_rlft.rollout.engines.hf import HFEngine

        engine = HFEngine(max_batch_size=a.generation_batch_size)
    settings = dict(
        engine=engine, model="tiny", tiny=TinyConfig(**TINY_SMALL), reward_funcs=[a.reward],
        generation=GenerationConfig(num_generations=4, max_completion_length=8),
        asynchronous=AsyncConfig(depth=a.async_depth, threads=1),
        loss=GRPOLoss(**dict(_option(kv) for kv in a.loss.split(",") if kv)),
        optim=OptimConfig(learning_rate=1e-3, micro_batch_size=a.micro_batch_size,
                          gradient_checkpointing=a.gradient_checkpointing,
                          micro_batch_tokens=a.micro_batch_tokens, padding_free=a.padding_free,
                          shared_prompt=a.shared_prompt, logprob_chunk_tokens=a.logprob_chunk_tokens),
        lora=LoRAConfig(r=4, alpha=8) if a.lora else None,
    )
    if a.env != "none":
        from tests.distributed.helpers import EchoEnv

        settings.update(environment=EchoEnv(stop_on_rank=0 if a.env == "echo-rank0-stops" else None), episodes={"max_turns": 2, "max_tokens": 24, "num_workers": 1,
                                                         "observation_format": "text"})
    val = CountdownTask(size=a.val, split="test", seed=1) if a.val else None
    dm = PromptDataModule(train=CountdownTask(size=a.pool, split="train", seed=0), val=val, answer_field=None,
                          batch_size=a.batch_size, val_batch_size=4)
    callbacks = make_callbacks(a.callbacks.split(","), out)
    if a.launcher == "fabric":
        from lit_rlft.lightning.fabric import FabricLoop

        if a.strategy == "fsdp2":
            from lightning.fabric.strategies import ModelParallelStrategy

            from lit_rlft.lightning.fabric import fsdp2_parallelize

            strategy = ModelParallelStrategy(fsdp2_parallelize, data_parallel_size=a.devices, tensor_parallel_size=1)
        else:
            strategy = "ddp" if a.devices > 1 else "auto"
        fabric = L.Fabric(accelerator="cpu", devices=a.devices, strategy=strategy)
        fabric.launch()
        probe = Probe(out, fabric.global_rank, a.dump)
        loop = FabricLoop(fabric, max_steps=a.steps, callbacks=[*callbacks, probe],
                          val_every_n_steps=2 if a.val else None)
        probe.finish(loop.fit(GRPOConfig(**settings), dm))
        return
    module = GRPOModule(**settings)
    if a.engine == "servers":
        from tests.rollout.servers.fake_servers import HTTPFakeSync

        module.grpo.source.engine._sync = HTTPFakeSync()
    if a.strategy == "fsdp2":
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy = ModelParallelStrategy(data_parallel_size=a.devices, tensor_parallel_size=1,
                                         process_group_backend="gloo")
    else:
        strategy = "ddp" if a.devices > 1 else "auto"
    extra = []
    if a.ckpt_every:
        from lightning.pytorch.callbacks import ModelCheckpoint

        extra.append(ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=a.ckpt_every, save_top_k=-1))
    probe = Probe(out, 0, a.dump)
    trainer = L.Trainer(
        accelerator="cpu", devices=a.devices, strategy=strategy, max_steps=a.steps, logger=False,
        enable_checkpointing=bool(a.ckpt_every), enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=1.0 if a.val else 0, val_check_interval=2 if a.val else None,
        check_val_every_n_epoch=None, default_root_dir=str(out), callbacks=[*callbacks, probe, *extra],
    )
    probe.rank = trainer.global_rank
    trainer.fit(module, datamodule=dm, ckpt_path=a.resume)
    probe.finish(module.grpo)
    if torch.distributed.is_initialized():
        # c10d's threads joined before the interpreter exits: left to exit, a rank now and then aborted after its
        # work was done ("terminate called without an active exception"; seen once, a resumed FSDP2 + LoRA run)
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
