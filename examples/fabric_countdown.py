"""GRPO with DPS + rollout replay on Countdown under Lightning Fabric (no Trainer).

    python examples/fabric_countdown.py --max-steps 20                                 # one process
    python examples/fabric_countdown.py --devices 2 --max-steps 20                     # two (Fabric launches them)
    torchrun --nproc-per-node 2 examples/fabric_countdown.py --devices 2 --max-steps 4
    fabric run --accelerator cpu --devices 2 --strategy ddp examples/fabric_countdown.py --max-steps 4

The settings of a Trainer run (a GRPOConfig holds GRPOModule's arguments), the same datamodule and callbacks; no
Trainer and no LightningModule: FabricLoop builds the step and drives it. Under
``fabric run`` the command line chooses accelerator, devices and strategy and starts the processes, so the script
neither passes them to ``Fabric`` nor calls ``launch()``. Without a warm start (``--model runs/sft/model``, from
``lit-rlft sft --config configs/sft_countdown_tiny.yaml``) the tiny policy is untrained and its rewards stay at 0:
the run shows the mechanics, not learning.
"""

from __future__ import annotations

import argparse
import os

import lightning as L
from lightning.fabric.loggers import TensorBoardLogger

from lit_rlft import (
    CountdownTask,
    DPSCallback,
    FabricLoop,
    GenerationConfig,
    GRPOConfig,
    OptimConfig,
    PromptDataModule,
    ReplayCallback,
    RolloutBudgetStop,
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--model", default="tiny", help="an HF checkpoint directory, or 'tiny'")
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--out", default="runs/fabric_countdown")
    a = p.parse_args()

    logger = TensorBoardLogger(a.out, name="tb")
    if os.environ.get("LT_CLI_USED") == "1":  # `fabric run` chose the accelerator, devices, strategy and launched
        fabric = L.Fabric(loggers=logger)
    else:
        fabric = L.Fabric(accelerator=a.accelerator, devices=a.devices, loggers=logger,
                          strategy="ddp" if a.devices > 1 else "auto")
        fabric.launch()
    fabric.seed_everything(0)
    config = GRPOConfig(model=a.model, reward_funcs=["lit_rlft.rewards.countdown_reward"],
                        generation=GenerationConfig(num_generations=8, max_completion_length=16),
                        optim=OptimConfig(learning_rate=1e-4, warmup_steps=5))
    data = PromptDataModule(train=CountdownTask(size=20_000, num_numbers=[2, 3, 4], split="train", seed=1),
                            val=CountdownTask(size=200, num_numbers=[2, 3, 4], split="test", seed=2),
                            answer_field=None, batch_size=16)
    loop = FabricLoop(fabric, max_steps=a.max_steps, val_every_n_steps=10, checkpoint_dir=a.out,
                      callbacks=[DPSCallback(decay=0.5), ReplayCallback(delta=0.5, capacity=128),
                                 RolloutBudgetStop(max_completions=50_000)])
    step = loop.fit(config, data)
    metrics = loop.validate()  # the held-out accuracy of the final policy
    loop.save(f"{a.out}/last.ckpt")
    fabric.print(f"{step.rollout_step} rollout steps, {step.budget.completions} completions, "
                 f"held-out accuracy {metrics['val/accuracy']:.3f}")


if __name__ == "__main__":
    main()
