"""GRPO with DPS + rollout replay on Countdown under Lightning Fabric (no Trainer).

    python examples/fabric_countdown.py --devices 1 --max-steps 20                 # one process
    fabric run --accelerator cpu --devices 2 --strategy ddp examples/fabric_countdown.py --devices 2
    torchrun --nproc-per-node 2 examples/fabric_countdown.py --devices 2

The same GRPOModule, datamodule and callbacks as a Trainer run; FabricLoop plays the Trainer's part. Without a warm
start (``--model runs/sft/model``, from ``lit-rlft sft --config configs/sft_countdown_tiny.yaml``) the tiny policy is
untrained and its rewards stay at 0: the run shows the mechanics, not learning.
"""

from __future__ import annotations

import argparse

import lightning as L
from lightning.fabric.loggers import TensorBoardLogger

from lit_rlft import (
    CountdownTask,
    DPSCallback,
    GRPOModule,
    PromptDataModule,
    ReplayCallback,
    RolloutBudgetStop,
)
from lit_rlft.lightning.fabric import FabricLoop


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--model", default="tiny", help="an HF checkpoint directory, or 'tiny'")
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--out", default="runs/fabric_countdown")
    a = p.parse_args()

    fabric = L.Fabric(accelerator=a.accelerator, devices=a.devices, strategy="ddp" if a.devices > 1 else "auto",
                      loggers=TensorBoardLogger(a.out, name="tb"))
    fabric.launch()
    fabric.seed_everything(0)
    module = GRPOModule(model=a.model, reward_funcs=["lit_rlft.rewards.countdown_reward"], num_generations=8,
                        max_completion_length=16, learning_rate=1e-4, warmup_steps=5)
    data = PromptDataModule(train=CountdownTask(size=20_000, num_numbers=[2, 3, 4], split="train", seed=1),
                            val=CountdownTask(size=200, num_numbers=[2, 3, 4], split="test", seed=2),
                            answer_field=None, batch_size=16)
    loop = FabricLoop(fabric, max_steps=a.max_steps, val_every_n_steps=10, checkpoint_dir=a.out,
                      callbacks=[DPSCallback(decay=0.5), ReplayCallback(delta=0.5, capacity=128),
                                 RolloutBudgetStop(max_completions=50_000)])
    loop.fit(module, data)
    loop.save(f"{a.out}/last.ckpt")
    fabric.print(f"{module.grpo.rollout_step} rollout steps, {module.grpo.budget.completions} completions, "
                 f"held-out accuracy {module.last_eval.get('val/accuracy', float('nan')):.3f}")


if __name__ == "__main__":
    main()
