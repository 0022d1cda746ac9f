"""``lit-rlft probe``: before any training, what would the config's groups teach? (:mod:`lit_rlft.study.probe`)

    lit-rlft probe --config run.yaml --prompts 64 --val-prompts 64 --out runs/probe
"""

from __future__ import annotations

import argparse
import sys

from lit_rlft.study.probe import ProbeError, ProbeSettings

PROG = "lit-rlft probe"


def parser() -> argparse.ArgumentParser:
    d = ProbeSettings(configs=[])
    p = argparse.ArgumentParser(
        prog=PROG, description="Sample G completions for a sample of the training pool and of the held-out set under "
                               "the config's policy and sampling, and report the pass-rate histogram, the share of "
                               "groups with something to teach and of completions in the answer format, per task "
                               "and difficulty, with a verdict: <out>/probe.json, probe.md, probe.png.")
    p.add_argument("--config", action="append", required=True, metavar="FILE",
                   help="the run config (a lit-rlft fit YAML); repeat to merge files in order")
    p.add_argument("--prompts", type=int, default=d.prompts, help=f"training-pool prompts (default {d.prompts})")
    p.add_argument("--val-prompts", type=int, default=d.val_prompts,
                   help=f"held-out prompts of data.val (default {d.val_prompts}; 0: none)")
    p.add_argument("--num-generations", type=int, default=None,
                   help="completions per prompt (default: the config's model.generation.num_generations)")
    p.add_argument("--seed", type=int, default=d.seed, help="sampling seed (default 0)")
    p.add_argument("--format-reward", default=None, metavar="DOTTED.PATH",
                   help="a reward saying whether a completion is in the answer format (default: the config's format "
                        "reward, e.g. lit_rlft.rewards.AnswerFormatReward)")
    p.add_argument("--batch-prompts", type=int, default=None, help="prompts per generation call (default: "
                                                                    "data.val_batch_size)")
    p.add_argument("--out", default=d.out, help=f"the probe's folder (default {d.out})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    from lit_rlft.cli.lightning_cli import fail
    from lit_rlft.study.probe import run_probe

    a = parser().parse_args(argv)
    try:
        settings = ProbeSettings(configs=a.config, prompts=a.prompts, val_prompts=a.val_prompts,
                                 num_generations=a.num_generations, seed=a.seed, out=a.out,
                                 format_reward=a.format_reward, batch_prompts=a.batch_prompts)
        result = run_probe(settings, progress=not a.no_progress)
    except ProbeError as e:
        fail(PROG, str(e))
    from pathlib import Path

    print((Path(a.out) / "probe.md").read_text(encoding="utf-8"))
    print(f"{PROG}: wrote {a.out}/probe.json, probe.md and probe.png in {result['timings']['probe_s']:.0f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
