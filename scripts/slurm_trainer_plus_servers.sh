#!/bin/bash
# GRPO on MATH with Qwen2.5-Math-1.5B: the trainer on one node (8 GPUs, FSDP2 + LoRA, DPS + replay), generation on
# two more nodes (one vLLM server per GPU: 16 servers), weights pushed over one NCCL group, one step generated ahead.
#
#   sbatch scripts/slurm_trainer_plus_servers.sh
#
# Layout (docs/servers.md): node 0 runs the 8 trainer ranks (Lightning reads the SLURM environment); nodes 1-2 run
# `lit-rlft serve` once per GPU, listening on the node's address on the cluster's private network (a server's dev
# routes are not guarded by vLLM's --api-key: never expose them beyond it). Every trainer rank sends its own slice of
# each batch to the servers (whole groups, split over them); rank 0 alone pushes the weights, to all 16 servers at
# once, after every update. The secrets travel in the environment, never on command lines.
#SBATCH --job-name=lit-rlft-servers
#SBATCH --nodes=3
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --mem=0
#SBATCH --time=24:00:00
#SBATCH --output=runs/slurm-%j.out

set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
export TOKENIZERS_PARALLELISM=false
export NCCL_ASYNC_ERROR_HANDLING=1
LIT_RLFT_SYNC_TOKEN=$(python3 -c "import secrets; print(secrets.token_urlsafe(32))")
VLLM_API_KEY=$(python3 -c "import secrets; print(secrets.token_urlsafe(32))")
export LIT_RLFT_SYNC_TOKEN VLLM_API_KEY

mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
TRAINER=${NODES[0]}
TRAINER_IP=$(srun --nodes=1 --ntasks=1 -w "$TRAINER" hostname -I | awk '{print $1}')
RENDEZVOUS="$TRAINER_IP:29600"
MODEL=Qwen/Qwen2.5-Math-1.5B   # or the folder of a warm start; every server loads it once, then gets pushes

URLS=()
for node in "${NODES[@]:1}"; do
    ip=$(srun --nodes=1 --ntasks=1 -w "$node" hostname -I | awk '{print $1}')
    for gpu in 0 1 2 3 4 5 6 7; do
        port=$((8000 + gpu))
        srun --nodes=1 --ntasks=1 --gpus=1 -w "$node" --exact \
            env CUDA_VISIBLE_DEVICES=$gpu .venv/bin/lit-rlft serve --model "$MODEL" --device cuda \
            --host "$ip" --port $port --sync-rendezvous "$RENDEZVOUS" --dtype bfloat16 --lora-rank 16 \
            --log "runs/server-$SLURM_JOB_ID-$node-$gpu.log" -- --max-model-len 4096 &
        URLS+=("\"$ip:$port\"")
    done
done
SERVERS="[$(IFS=,; echo "${URLS[*]}")]"

# before its first request the trainer waits for the servers to answer /health (ServerEngine's start_timeout_s: a
# server takes a minute or two to load); its rank 0 listens at the rendezvous for them to join the weight-sync group
srun --nodes=1 --ntasks=8 --gpus-per-node=8 -w "$TRAINER" .venv/bin/lit-rlft fit \
    --config configs/math_qwen2.5-math-1.5b.yaml \
    --config configs/parallel/fsdp2_1x8.yaml \
    --config configs/lora.yaml \
    --config configs/strategies/paper_dps_replay.yaml \
    --model.engine lit_rlft.rollout.ServerEngine \
    --model.engine.urls "$SERVERS" \
    --model.engine.rendezvous "$RENDEZVOUS" \
    --model.engine.lora_sync adapter \
    --model.asynchronous.depth 1 \
    --trainer.default_root_dir runs/math_servers \
    --trainer.logger.init_args.save_dir runs/math_servers
kill $(jobs -p) 2>/dev/null || true   # stop the servers' srun steps (they would end with the job anyway)
