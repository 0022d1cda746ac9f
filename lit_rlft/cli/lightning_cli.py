"""The LightningCLI glue of ``lit-rlft fit | validate | sft``: one-line errors (``lit-rlft fit: error: ...``, exit
status 2) for bad options, constructor arguments, model paths, data files and checkpoints, all before training step
0 (``LIT_RLFT_DEBUG=1`` shows the full traceback instead); a ``--ckpt_path`` that is checked before it is loaded; and
atomic checkpoint writes (:class:`~lit_rlft.lightning.checkpointing.AtomicCheckpointIO`).

:func:`grpo_cli` and :func:`sft_cli` build the CLIs; :mod:`lit_rlft.cli.main` dispatches the commands (and
``lit_rlft.study`` runs each arm of a study through :func:`grpo_cli`).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lit_rlft.cli.errors import condense_parser_error, describe_constructor_error
from lit_rlft.core.finite import nonfinite_paths
from lit_rlft.data.datamodule import PromptDataModule
from lit_rlft.data.loading import DataValidationError
from lit_rlft.lightning.checkpointing import (
    CheckpointError,
    check_checkpoint,
    describe_load_error,
    is_local_checkpoint_path,
    use_atomic_checkpoint_io,
)
from lit_rlft.lightning.module import GRPOModule
from lit_rlft.lightning.sft import SFTDataModule, SFTModule
from lit_rlft.models.loading import ModelSourceError

PROG = "lit-rlft"
#: The LightningCLI commands, with the line ``lit-rlft --help`` shows for each.
CLI_COMMANDS = {
    "fit": "train a policy with GRPO (--config, --print_config)",
    "validate": "held-out evaluation (data.val) of a policy or a --ckpt_path",
    "sft": "supervised warm start: writes the HF model a GRPO config loads",
}
#: Errors whose message is the whole story: printed as one line, no traceback.
USER_ERRORS = (ModelSourceError, DataValidationError, CheckpointError)
#: What a constructor raises for a bad argument (printed as one line naming the class).
_ARGUMENT_ERRORS = (ValueError, TypeError, OSError, MisconfigurationException)
_CLI_KWARGS = dict(save_config_kwargs={"overwrite": True}, auto_configure_optimizers=False)


def debug_enabled() -> bool:
    """``LIT_RLFT_DEBUG=1`` (or jsonargparse's ``JSONARGPARSE_DEBUG``): full tracebacks instead of one line."""
    flags = (os.environ.get("LIT_RLFT_DEBUG", ""), os.environ.get("JSONARGPARSE_DEBUG", ""))
    return any(v.lower() not in ("", "0", "false") for v in flags)


def fail(prog: str, message: str) -> NoReturn:
    """Print ``<prog>: error: <message>`` on stderr and exit with status 2 (argparse's convention)."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    raise SystemExit(2)


class LitArgumentParser(LightningArgumentParser):
    """LightningArgumentParser whose errors are one line (:func:`~lit_rlft.cli.errors.condense_parser_error`)
    instead of the usage (a hundred lines) and jsonargparse's dump of every type an option accepts."""

    #: The parser of the subcommand on the command line (set by :class:`LitCLI`): names the command in errors that
    #: jsonargparse raises from the main parser, and offers its options as did-you-mean candidates.
    command_parser: LightningArgumentParser | None = None

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or debug_enabled():
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self.command_parser or self
        prog = parser.prog.replace(" [options]", "")
        options = [a.dest for a in parser._actions if isinstance(a.dest, str)]
        fail(prog, condense_parser_error(message, prog, options))


class LitCLI(LightningCLI):
    """LightningCLI for lit_rlft: the ``fit`` and ``validate`` commands (``test`` / ``predict`` are not offered:
    GRPOModule has no ``test_step`` / ``predict_step``), one-line errors, a checked ``ckpt_path`` and atomic
    checkpoint writes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parser_class", LitArgumentParser)
        super().__init__(*args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {k: v for k, v in LightningCLI.subcommands().items() if k in ("fit", "validate")}

    def _ckpt_path(self) -> Any:
        section = self.config.get("subcommand")
        return (self.config[section] if section else self.config).get("ckpt_path")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse, then check ``ckpt_path`` (before LightningCLI reads hyper-parameters from it)."""
        argv = sys.argv[1:] if args is None else args
        if isinstance(parser, LitArgumentParser) and isinstance(argv, list):
            command = next((a for a in argv if a in self.subcommands()), None)
            parser.command_parser = getattr(self, "_subcommand_parsers", {}).get(command)
        super().parse_arguments(parser, args)
        self._refuse_nonfinite()
        path = self._ckpt_path()
        if path and is_local_checkpoint_path(path):
            try:
                check_checkpoint(path)
            except CheckpointError as e:
                fail(self._prog(), f"--ckpt_path: {e}")

    def _refuse_nonfinite(self) -> None:
        """A NaN or infinite number anywhere in the parsed config (a callback's settings included) is one line naming
        its key, before anything is built."""
        tree = self._config_tree()
        for path in nonfinite_paths(tree, ""):
            fail(self._prog(), f"{path}: must be a finite number, got {_lookup(tree, path)}")

    def _config_tree(self) -> dict[str, Any]:
        """The parsed config of the command (its subcommand's section), as nested dicts."""
        section = self.config.get("subcommand")
        tree = self.config[section] if section else self.config
        return tree.as_dict() if hasattr(tree, "as_dict") else dict(tree)

    def _parse_ckpt_path(self) -> None:
        """LightningCLI (2.6) unpickles ``ckpt_path`` here for its hyper-parameters: a corrupt file is one line."""
        parse = getattr(super(), "_parse_ckpt_path", None)
        if parse is None:
            return
        try:
            parse()
        except Exception as e:  # only torch.load runs here besides the parser, which exits by itself
            fail(self._prog(), f"--ckpt_path: {describe_load_error(self._ckpt_path(), e)}")

    def instantiate_classes(self) -> None:
        """Instantiate the config; a constructor's argument error is one line naming the class."""
        try:
            super().instantiate_classes()
        except USER_ERRORS:
            raise
        except _ARGUMENT_ERRORS as e:
            if debug_enabled():
                raise
            fail(self._prog(), describe_constructor_error(e, self._config_tree()))

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        """The Trainer, writing single-file checkpoints atomically (``AtomicCheckpointIO``) unless a custom checkpoint
        IO plugin is given."""
        trainer = super().instantiate_trainer(**kwargs)
        use_atomic_checkpoint_io(trainer.strategy)
        return trainer

    def _prog(self) -> str:
        section = self.config.get("subcommand") if getattr(self, "config", None) is not None else None
        return f"{self.parser.prog} {section}" if section else self.parser.prog


class SFTCLI(LitCLI):
    """``lit-rlft sft``: no subcommand (it always fits), ``--ckpt_path`` to resume."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--ckpt_path", type=str | None, default=None,
                            help="resume from this checkpoint (a .ckpt file written by the Trainer)")


def _lookup(tree: Any, path: str) -> Any:
    for part in path.replace("[", ".[").split("."):
        if part:
            tree = tree[int(part[1:-1])] if part.startswith("[") else tree[part]
    return tree


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
    parser_kwargs: dict[str, Any] = {"prog": PROG}
    if run:
        parser_kwargs.update({name: {"description": CLI_COMMANDS[name]} for name in ("fit", "validate")})
    with _explicit_args(args):
        return LitCLI(GRPOModule, PromptDataModule, args=args, run=run, parser_kwargs=parser_kwargs, **_CLI_KWARGS)


def sft_cli(args: list[str] | None = None) -> LightningCLI:
    """Supervised warm start: ``lit-rlft sft --config ...`` fits :class:`SFTModule` and writes its HF checkpoint."""
    with _explicit_args(args or []):
        cli = SFTCLI(SFTModule, SFTDataModule, args=args or [], run=False,
                     parser_kwargs={"prog": f"{PROG} sft", "description": CLI_COMMANDS["sft"]}, **_CLI_KWARGS)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.get("ckpt_path"))
    return cli
