"""The command line: ``lit-rlft fit | validate | sft | dots-adapters`` (LightningCLI), ``lit-rlft serve`` (a vLLM
generation server), its one-line errors, the demo.

``python -m lit_rlft.cli fit ...`` is ``lit-rlft fit ...`` (what ``torchrun -m`` needs).
"""

from lit_rlft.cli.main import grpo_cli, main, sft_cli

__all__ = ["grpo_cli", "main", "sft_cli"]
