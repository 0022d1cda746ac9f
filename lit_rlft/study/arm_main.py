"""The command line of a study arm that another loop than ``lit-rlft fit`` runs (``python -m
lit_rlft.study.fabric_arm``, ``python -m lit_rlft.study.trl_arm``): ``--config`` (the run's composed config),
optionally ``--ckpt_path``, and an arm's own error as one line and exit code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["arm_main"]


def arm_main(module: str, doc: str | None, run: Callable[[str, str | None], Any], error: type[Exception],
             argv: Sequence[str] | None = None, resumable: bool = False) -> int:
    """Parse ``argv``, call ``run(config, ckpt_path)``; ``error`` becomes ``<module>: error: ...`` on stderr and 2."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="a study run's composed config (<out>/arms/<run>/config.yaml)")
    if resumable:
        p.add_argument("--ckpt_path", default=None, help="resume from this checkpoint (the study's resume.ckpt)")
    a = p.parse_args(argv)
    try:
        run(a.config, getattr(a, "ckpt_path", None))
    except error as e:
        print(f"{module}: error: {e}", file=sys.stderr)
        return 2
    return 0
