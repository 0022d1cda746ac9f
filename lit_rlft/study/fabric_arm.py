"""One study run through Lightning Fabric instead of the Trainer: ``lit-rlft study --loop fabric``.

    python -m lit_rlft.study.fabric_arm --config <out>/arms/dps-seed0/config.yaml [--ckpt_path <run>/resume.ckpt]

The run's composed config (the user's ``lit-rlft fit`` config, the arm's callbacks, the study's
:class:`~lit_rlft.study.callback.StudyCallback`) is parsed by the same LightningCLI as ``lit-rlft fit``
(``seed_everything`` applied, every class built), and its parts go to :class:`~lit_rlft.lightning.fabric.FabricLoop`:
the model's :class:`~lit_rlft.step.config.GRPOConfig`, the datamodule, ``trainer.callbacks`` (each a lit_rlft step
callback: the loop refuses any other, naming it; the CLI's own ``SaveConfigCallback`` is left out), ``trainer.max_steps`` and ``trainer.logger`` (TensorBoard under the
run's folder, where the study reads its series). The measurement is the same callback as under the Trainer, over the
same declared step context, and its checkpoint goes through ``FabricLoop.save`` in the Trainer's layout.

One process, one device (``trainer.accelerator``): a multi-rank Fabric run is launched by the user's own script
(``examples/fabric_countdown.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lit_rlft.cli.lightning_cli import grpo_cli
from lit_rlft.lightning.fabric import FabricLoop
from lit_rlft.study.arm_main import arm_main
from lit_rlft.study.callback import StudyCallback

__all__ = ["FabricArmError", "main", "run"]


class FabricArmError(ValueError):
    """A composed config the Fabric loop cannot run as a study arm."""


def _accelerator(trainer: Any) -> str:
    name = type(trainer.accelerator).__name__
    return "cpu" if name == "CPUAccelerator" else "cuda" if name == "CUDAAccelerator" else "auto"


def run(config_path: str, ckpt_path: str | None = None) -> None:
    """Train the composed run config ``config_path`` with ``FabricLoop`` (see the module docstring), resuming from
    ``ckpt_path`` when given."""
    import lightning as L
    from lightning.pytorch.cli import SaveConfigCallback


    cli = grpo_cli(["--config", str(config_path)], run=False)
    module, data, trainer = cli.model, cli.datamodule, cli.trainer
    callbacks = [c for c in trainer.callbacks if not isinstance(c, SaveConfigCallback)]  # the CLI's: the run's
    # composed config is already in its folder
    if not any(isinstance(c, StudyCallback) for c in callbacks):
        raise FabricArmError(f"{config_path}: the config has no lit_rlft.study.StudyCallback: the Fabric arm runs a "
                             "study's composed config")
    if trainer.world_size != 1:
        raise FabricArmError(f"{config_path}: the Fabric arm runs one process on one device (trainer.devices gives "
                             f"{trainer.world_size}); launch a multi-rank FabricLoop from a script of your own")
    fabric = L.Fabric(accelerator=_accelerator(trainer), devices=1, loggers=list(trainer.loggers))
    loop = FabricLoop(fabric, max_steps=int(trainer.max_steps), callbacks=callbacks, progress_bar=False,
                      checkpoint_dir=str(Path(config_path).parent))
    loop.fit(module.config, data, ckpt_path=ckpt_path)
    for logger in fabric.loggers:
        logger.finalize("success")


def main(argv: list[str] | None = None) -> int:
    return arm_main("lit_rlft.study.fabric_arm", __doc__, run, FabricArmError, argv, resumable=True)


if __name__ == "__main__":
    sys.exit(main())
