"""The 2 ranks of the failure-join test; ``python failure_join_ranks.py OUT_DIR`` starts both (gloo, spawn).

``MASTER_ADDR`` / ``MASTER_PORT`` come from the environment (the test picks a free port). Every rank builds a tiny
:class:`~lit_rlft.step.grpo.GRPOStep` (no Lightning) and rolls out one batch of 4 prompts, 2 per rank. Rank 1's reward
returns no scores, which the reward runner turns into an error: ``step.rollout`` raises ``RankFailure`` on both ranks.
Each rank writes ``OUT_DIR/rank<r>.json``: the ``time.time()`` of its failure and the exception's text. Then rank 1
does NOT exit: it lingers, as a process whose rank failed may (under NCCL the peers learn nothing from the process
ending, only from the collective timeout), until rank 0's file appears or ``LINGER_S`` pass. Every rank exits 0 after
writing its file (``torch.multiprocessing.spawn`` would terminate the other rank as soon as one fails).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: How long rank 1 stays alive after its failure, unless rank 0 has written its result by then.
LINGER_S = 30.0


def rank_main(rank: int, world_size: int, out: Path) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    from lit_rlft import CountdownTask, GenerationConfig, GRPOConfig, PromptDataModule, build_step
    from lit_rlft.models.tiny import TinyConfig
    from lit_rlft.runtime.distributed import get_collective

    tiny = TinyConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                      intermediate_size=128, head_dim=64)
    step = build_step(GRPOConfig(model="tiny", tiny=tiny,
                                 reward_funcs=["tests.distributed.helpers.coin_reward_broken_on_rank_1"],
                                 generation=GenerationConfig(num_generations=4, max_completion_length=8)))
    result: dict[str, object] = {"rank": rank, "failed_at": None, "error": None}
    try:
        data = PromptDataModule(train=CountdownTask(size=48, split="train", seed=0), answer_field=None,
                                batch_size=4)
        data.setup("fit")
        step.bind(data, get_collective())
        dist.barrier()  # both ranks built: the failure below is the only thing timed
        try:
            step.rollout(np.arange(4))
        except Exception as exc:
            result.update(failed_at=time.time(), type=type(exc).__name__, error=str(exc))
        else:
            result["error"] = "no exception"
    except Exception:  # a broken setup: the test shows it
        result["setup_error"] = traceback.format_exc()
    finally:
        step.close()
    tmp = out / f"rank{rank}.json.tmp"
    tmp.write_text(json.dumps(result), encoding="utf-8")
    tmp.replace(out / f"rank{rank}.json")
    if rank == 1:  # linger: a failed rank whose process does not end at once
        deadline = time.monotonic() + LINGER_S
        while time.monotonic() < deadline and not (out / "rank0.json").exists():
            time.sleep(0.1)
    os._exit(0)  # no teardown: the peer may have left the process group


def main(out: Path) -> None:
    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    mp.spawn(rank_main, args=(2, out), nprocs=2, join=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
