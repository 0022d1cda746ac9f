"""One rank of the 2-rank reward-lifetime test; ``torchrun --nproc-per-node 2`` starts both.

    torchrun --standalone --nproc-per-node 2 tests/distributed/reward_lifetime_ranks.py OUT_DIR

Every rank builds a ``RewardRunner`` (2 worker processes) and scores a batch; rank 0 writes every rank's pid and
workers' pids to ``OUT_DIR/pids.json``. Then rank 1 dies by ``SIGKILL`` while rank 0 is busy scoring, and torchrun
stops rank 0 (``SIGTERM``), as a launcher does when one rank fails. No GRPOModule or Trainer here: only the ranks
and their reward processes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch.distributed as dist  # noqa: E402

from lit_rlft.rewards.runner import RewardRunner  # noqa: E402


def length(completions: list[str], **columns: object) -> list[float]:
    """len(c); "slow" stays busy for two minutes (a long reward the ranks are killed in the middle of)."""
    (c,) = completions
    if c == "slow":
        time.sleep(120)
    return [float(len(c))]


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    runner = RewardRunner([length], timeout_s=60.0, num_workers=2)
    assert runner(["a", "bb"]).total.tolist() == [1.0, 2.0]
    gathered: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"rank": os.getpid(), "workers": runner.pool.pids()})
    if rank == 0:
        tmp = out / "pids.json.tmp"
        tmp.write_text(json.dumps(gathered), encoding="utf-8")
        tmp.replace(out / "pids.json")
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    runner(["slow", "slow"])  # rank 0: still scoring when torchrun stops it


if __name__ == "__main__":
    main(Path(sys.argv[1]))
