"""lit_rlft: data-efficient reinforcement fine-tuning of LLMs on PyTorch Lightning.

GRPO with rollout replay as a LightningModule; online data selection (DOTS, DPS, dynamic sampling, history
resampling) and replay as composable Lightning callbacks.
"""

__version__ = "0.1.0"
