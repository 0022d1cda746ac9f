#!/bin/bash
# GRPO on MATH with Qwen2.5-Math-1.5B, LoRA, FSDP2 over 2 nodes x 8 GPUs, DPS choosing the fresh half of each batch
# and rollout replay supplying the other half.
#
#   sbatch scripts/slurm_2x8_fsdp_lora_dps_replay.sh
#
# Lightning reads the SLURM environment (one task per GPU, as below) and sets up the 16 ranks itself; the same run
# with torchrun is in docs/distributed.md. The global batch (data.batch_size: 64) and its fresh half (32) divide by
# the 16 ranks: each rank rolls out 2 fresh prompts x 8 completions per step and trains on 4 groups.
#SBATCH --job-name=lit-rlft-dps-replay
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --mem=0
#SBATCH --time=24:00:00
#SBATCH --output=runs/slurm-%j.out

set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
export TOKENIZERS_PARALLELISM=false
export NCCL_ASYNC_ERROR_HANDLING=1   # a failed rank ends the job instead of hanging the others

srun .venv/bin/lit-rlft fit \
    --config configs/math_qwen2.5-math-1.5b.yaml \
    --config configs/parallel/fsdp2_2x8.yaml \
    --config configs/lora.yaml \
    --config configs/strategies/paper_dps_replay.yaml \
    --trainer.default_root_dir runs/math_dps_replay_2x8 \
    --trainer.logger.init_args.save_dir runs/math_dps_replay_2x8
