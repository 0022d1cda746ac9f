"""``lit-rlft``: the command line.

    lit-rlft fit --config configs/countdown_tiny.yaml          # GRPO (LightningCLI: fit | validate)
    lit-rlft fit --config configs/countdown_tiny.yaml --print_config
    lit-rlft validate --config configs/countdown_tiny.yaml --ckpt_path runs/.../last.ckpt
    lit-rlft sft --config configs/sft_countdown_tiny.yaml      # supervised warm start, saves an HF checkpoint
    lit-rlft probe --config my_run.yaml --prompts 64 --val-prompts 64   # before training: what would groups teach?
    lit-rlft study --config my_run.yaml --strategies uniform,dps --seeds 0,1,2 --completions 40000 --out runs/study
    lit-rlft dots-adapters --pairs pairs.jsonl --embedding-model PATH --out adapters.pt
    lit-rlft serve --model DIR --port 8001                      # a vLLM generation server (in .venv-vllm)

What the CLI adds to LightningCLI is in :mod:`lit_rlft.cli.lightning_cli` (one-line errors, checked checkpoints,
atomic checkpoint writes); this module dispatches the commands.
"""

from __future__ import annotations

import sys

from lit_rlft.cli.lightning_cli import CLI_COMMANDS, PROG, USER_ERRORS, debug_enabled, fail, grpo_cli, sft_cli

__all__ = ["COMMANDS", "fail", "grpo_cli", "main", "sft_cli"]

#: Every command, with the line ``lit-rlft --help`` shows for it.
COMMANDS = {
    **CLI_COMMANDS,
    "probe": "before training: the pass rates, groups with a gradient and answer format the config's pool gives",
    "study": "which strategy pays on your model and data: arms x seeds at an equal budget of completions",
    "dots-adapters": "train DOTS' adapters offline from (prompt, success rate) pairs",
    "serve": "start a vLLM generation server that a trainer pushes weights to",
}
_NOT_OFFERED = {
    "test": "GRPOModule has no test_step",
    "predict": "GRPOModule has no predict_step (generation runs inside fit and validate)",
}
_USAGE = f"usage: {PROG} <command> [options]"
_EPILOG = (
    f"`{PROG} <command> --help` lists a command's options. Not offered: test and predict\n"
    f"(`{PROG} validate` is the held-out evaluation).\n"
    "The Countdown strategy study runs from the repository root: python -m benchmarks.study --help"
)


def dots_adapters_cli(args: list[str] | None = None) -> None:
    """``lit-rlft dots-adapters``: train DOTS' adapters offline from (prompt, success rate) pairs."""
    from lit_rlft.cli.dots_adapters import main as dots_adapters_main

    dots_adapters_main(args)


def study_cli(args: list[str] | None = None) -> None:
    """``lit-rlft study``: several arms of a config at an equal budget of completions (:mod:`lit_rlft.study`)."""
    from lit_rlft.study.cli import main as study_main

    raise SystemExit(study_main(args))


def probe_cli(args: list[str] | None = None) -> None:
    """``lit-rlft probe``: what the config's groups would teach, before any training (:mod:`lit_rlft.study.probe`)."""
    from lit_rlft.study.probe_cli import main as probe_main

    raise SystemExit(probe_main(args))


def serve_cli(args: list[str] | None = None) -> None:
    """``lit-rlft serve``: vLLM's OpenAI server with lit_rlft's weight-sync extension (``docs/servers.md``)."""
    from lit_rlft.cli.serve import main as serve_main

    serve_main(args)


_DISPATCH = {"sft": sft_cli, "probe": probe_cli, "study": study_cli, "dots-adapters": dots_adapters_cli, "serve": serve_cli}


def top_level_help() -> str:
    """``lit-rlft --help``: every command with its line (each command parses its own options)."""
    width = max(map(len, COMMANDS)) + 2
    rows = "\n".join(f"  {name:<{width}}{text}" for name, text in COMMANDS.items())
    return (f"{_USAGE}\n\nGRPO reinforcement fine-tuning of LLMs on PyTorch Lightning.\n\ncommands:\n{rows}\n\n"
            f"{_EPILOG}\n")


def _check_command(argv: list[str]) -> None:
    """Top-level help and unknown commands; anything starting with an option goes to LightningCLI as before."""
    head = argv[0] if argv else None
    if head in ("-h", "--help"):
        sys.stdout.write(top_level_help())
        raise SystemExit(0)
    if head is None:
        sys.stderr.write(_USAGE + "\n")
        fail(PROG, f"a command is required: {', '.join(COMMANDS)} (see `{PROG} --help`)")
    if head in _NOT_OFFERED:
        fail(PROG, f"'{head}' is not offered: {_NOT_OFFERED[head]}; `{PROG} validate` runs the held-out "
                   "evaluation (data.val)")
    if not head.startswith("-") and head not in COMMANDS:
        fail(PROG, f"unknown command {head!r}: choose from {', '.join(COMMANDS)} (see `{PROG} --help`)")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    _check_command(argv)
    command = argv[0] if argv[0] in COMMANDS else None
    try:
        if command in _DISPATCH:
            _DISPATCH[command](argv[1:])
        else:
            grpo_cli(argv)
    except USER_ERRORS as e:
        if debug_enabled():
            raise
        fail(f"{PROG} {command}" if command else PROG, str(e))

