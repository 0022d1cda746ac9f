"""``lit-rlft``: the command line.

    lit-rlft fit --config configs/countdown_tiny.yaml          # GRPO (LightningCLI: fit | validate)
    lit-rlft fit --config configs/countdown_tiny.yaml --print_config
    lit-rlft sft --config configs/sft_countdown_tiny.yaml      # supervised warm start, saves an HF checkpoint
    lit-rlft dots-adapters --pairs pairs.jsonl --embedding-model PATH --out adapters.pt
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from lightning.pytorch.cli import LightningCLI

from lit_rlft.data.datamodule import PromptDataModule
from lit_rlft.module import GRPOModule
from lit_rlft.sft import SFTDataModule, SFTModule

_CLI_KWARGS = dict(save_config_kwargs={"overwrite": True}, auto_configure_optimizers=False)


@contextmanager
def _explicit_args(args: list[str] | None) -> Iterator[None]:
    """Silence LightningCLI's warning about getting both explicit ``args`` and ``sys.argv`` (they are the same
    command line, already dispatched on, e.g. ``sft --config ...``). ``sys.argv`` itself stays as it is: a
    multi-process strategy starts the other ranks by re-running it."""
    with warnings.catch_warnings():
        if args is not None:
            warnings.filterwarnings("ignore", message=r"LightningCLI.s args parameter is intended")
        yield


def grpo_cli(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    """GRPO through LightningCLI (``fit`` / ``validate`` subcommands when ``run``)."""
    with _explicit_args(args):
        return LightningCLI(GRPOModule, PromptDataModule, args=args, run=run, **_CLI_KWARGS)


def sft_cli(args: list[str] | None = None) -> LightningCLI:
    """Supervised warm start: ``lit-rlft sft --config ...`` runs ``fit`` of :class:`SFTModule`."""
    with _explicit_args(args or []):
        return LightningCLI(SFTModule, SFTDataModule, args=["fit", *(args or [])], **_CLI_KWARGS)


def dots_adapters_cli(args: list[str] | None = None) -> None:
    """``lit-rlft dots-adapters``: train DOTS' adapters offline from (prompt, success rate) pairs."""
    from lit_rlft.dots_adapters import main as dots_adapters_main

    dots_adapters_main(args)


_COMMANDS = {"sft": sft_cli, "dots-adapters": dots_adapters_cli}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _COMMANDS:
        _COMMANDS[argv[0]](argv[1:])
        return
    grpo_cli(argv)


if __name__ == "__main__":
    main()
