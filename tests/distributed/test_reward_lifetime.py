"""A 2-rank run whose rank 1 dies leaves no reward worker process behind, on either rank.

``torchrun`` starts ``reward_lifetime_ranks.py`` on 2 ranks (gloo); each rank scores through a ``RewardRunner`` with
2 workers. Rank 1 is killed (``SIGKILL``) while rank 0 is scoring; torchrun then stops rank 0 (``SIGTERM``). Before
the fix all 4 workers stayed alive, re-parented to init. About 10 s, mostly imports in three processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rewards.test_lifetime import kill_all, survivors

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "distributed" / "reward_lifetime_ranks.py"
pytestmark = pytest.mark.distributed


def test_no_reward_worker_outlives_a_failed_two_rank_run(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--monitor-interval", "0.1", str(SCRIPT), str(tmp_path)]
    log = tmp_path / "torchrun.log"
    with log.open("w") as f:  # a file, not a pipe: a leaked worker would hold a pipe open for good
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    pids: list[int] = []
    try:
        returncode = proc.wait(timeout=90)
        output = log.read_text(errors="replace")[-4000:]
        assert returncode != 0, "rank 1 was killed: torchrun must report the failure"
        assert (tmp_path / "pids.json").exists(), output
        ranks = json.loads((tmp_path / "pids.json").read_text(encoding="utf-8"))
        pids = [pid for rank in ranks for pid in rank["workers"]]
        assert len(pids) == 4
        assert survivors([rank["rank"] for rank in ranks]) == []
        assert survivors(pids) == [], f"reward workers outlived their ranks:\n{output}"
    finally:
        if not pids and (tmp_path / "pids.json").exists():  # failed early: still clean up what leaked
            pids = [pid for rank in json.loads((tmp_path / "pids.json").read_text()) for pid in rank["workers"]]
        kill_all(pids)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
