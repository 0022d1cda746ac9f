"""The warm start every run starts from: a given checkpoint, a fresh tiny policy, or the demo's SFT (run once)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.study.config import StudyConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def resolve_warm_start(cfg: StudyConfig, out: Path, threads: int = 1) -> str:
    """Return the model argument for every run (a checkpoint directory or ``"tiny"``).

    Without ``cfg.warm_start``, runs the SFT exactly as ``lit_rlft.cli.demo`` does (``configs/sft_countdown_tiny.yaml``
    through ``sft_cli``) into ``<out>/sft/model``, unless that checkpoint already exists.
    """
    if cfg.warm_start == "tiny":
        return "tiny"
    if cfg.warm_start:
        path = Path(cfg.warm_start)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"--warm-start {path}: no HF checkpoint there (config.json missing)")
        return str(path)
    model = out / "sft" / "model"
    if not (model / "config.json").exists():
        import torch

        from lit_rlft.cli import sft_cli

        torch.set_num_threads(threads)
        args = ["--config", str(CONFIGS / "sft_countdown_tiny.yaml"), "--model.output_dir", str(model),
                "--trainer.default_root_dir", str(out / "sft"),
                "--trainer.logger.init_args.save_dir", str(out / "sft")]
        if cfg.sft_steps:
            args += ["--trainer.max_steps", str(cfg.sft_steps)]
        sft_cli(args)
    return str(model)
