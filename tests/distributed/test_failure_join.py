"""A rank whose rollout fails joins the gather with its failure: its peers stop at once, even if it lingers.

``failure_join_ranks.py`` runs 2 gloo ranks of a Lightning-free ``GRPOStep``; rank 1's reward returns no scores, and
rank 1 then stays alive for up to 30 s (a failed process that does not end: under NCCL its peers would otherwise wait
for the collective timeout, minutes). Rank 0 must raise ``RankFailure`` naming rank 1 and its error within a few
seconds of rank 1's failure. Before a failing rank joined the gather, rank 0 waited for rank 1's process to end
(about 30 s here). About 10 s, mostly imports in three processes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "tests" / "distributed" / "failure_join_ranks.py"
pytestmark = pytest.mark.distributed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_failing_outside_generation_stops_its_lingering_peer_at_once(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=180)
    output = (result.stdout + result.stderr)[-4000:]
    assert result.returncode == 0, output
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in (0, 1))
    for r in (r0, r1):
        assert "setup_error" not in r, r["setup_error"]
        assert r["type"] == "RankFailure", r
        assert "generating and scoring train rollouts failed on rank 1 of 2" in r["error"], r["error"]
        assert "rank 1: ValueError:" in r["error"] and "returned 0 scores" in r["error"], r["error"]
    waited = r0["failed_at"] - r1["failed_at"]
    assert waited < 5.0, f"rank 0 stopped {waited:.1f} s after rank 1 failed (it waited for rank 1 to exit)"
