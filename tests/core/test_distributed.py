"""The one-process side of lit_rlft.core.distributed: shards, the failure protocol, metric reduction."""

from __future__ import annotations

import numpy as np
import pytest

from lit_rlft.core.distributed import Collective, LocalCollective, RankFailure, padded_shard, shard_slice


class FakeRanks(Collective):
    """A collective whose other ranks' contributions are given: what one rank sees in a W-rank run."""

    def __init__(self, rank: int, others: dict[int, object], world_size: int):
        self.rank, self.world_size, self.others = rank, world_size, others

    def all_gather(self, obj):
        return [obj if r == self.rank else self.others[r] for r in range(self.world_size)]

    def broadcast(self, obj, src=0):
        return obj if src == self.rank else self.others[src]


def test_shard_slice_splits_evenly_and_refuses_a_remainder():
    assert [shard_slice(8, r, 2) for r in (0, 1)] == [slice(0, 4), slice(4, 8)]
    with pytest.raises(ValueError, match="does not divide by the 3 ranks"):
        shard_slice(8, 0, 3)


@pytest.mark.parametrize("n, world", [(7, 2), (5, 3), (2, 4), (6, 3)])
def test_padded_shards_are_equal_and_give_back_every_id_once(n, world):
    ids = np.arange(100, 100 + n)
    shards = [padded_shard(ids, r, world) for r in range(world)]
    assert len({len(local) for local, _ in shards}) == 1  # equal work per rank
    assert np.concatenate([local[:valid] for local, valid in shards]).tolist() == ids.tolist()


def test_gather_checked_raises_on_every_rank_naming_the_failed_one():
    # rank 0's view: rank 1 reported an error in its gather payload
    coll = FakeRanks(0, {1: ("ValueError: reward returned 0 scores", None)}, world_size=2)
    with pytest.raises(RankFailure, match=r"scoring failed on rank 1 of 2 \(rank 1: ValueError: reward returned 0"):
        coll.gather_checked({"ok": 1}, None, "scoring")
    # rank 1's view: its own error is chained
    coll = FakeRanks(1, {0: (None, {"ok": 1})}, world_size=2)
    with pytest.raises(RankFailure, match="failed on rank 1") as exc:
        coll.gather_checked(None, KeyError("x"), "scoring")
    assert isinstance(exc.value.__cause__, KeyError)
    # nobody failed: the payloads
    assert FakeRanks(0, {1: (None, 7)}, 2).gather_checked(3, None, "x") == [3, 7]


def test_one_process_gather_checked_reraises_the_original_error():
    with pytest.raises(KeyError):
        LocalCollective().gather_checked(None, KeyError("x"), "scoring")


def test_reduce_metrics_means_mins_and_maxes():
    coll = FakeRanks(0, {1: {"loss": 3.0, "ratio/min": 0.5, "ratio/max": 2.0}}, world_size=2)
    out = coll.reduce_metrics({"loss": 1.0, "ratio/min": 0.2, "ratio/max": 4.0})
    assert out == {"loss": 2.0, "ratio/min": 0.2, "ratio/max": 4.0}


def test_check_same_raises_on_every_rank_naming_the_dissenters():
    # rank 1's view of a 3-rank run where rank 1 planned other prompts: every rank sees the same digests and raises
    coll = _DigestRanks(1, {0: ([1, 2], {"seed": 0}), 2: ([1, 2], {"seed": 0})}, world_size=3)
    with pytest.raises(RankFailure, match=r"the batch plan differs between ranks: rank 1 of 3 disagree"):
        coll.check_same(([3, 4], {"seed": 0}), "the batch plan")
    # a difference in state alone (the ids agree) is a mismatch too: the next draws would differ
    coll = _DigestRanks(0, {1: ([1, 2], {"seed": 1})}, world_size=2)
    with pytest.raises(RankFailure, match="rank 1 of 2"):
        coll.check_same(([1, 2], {"seed": 0}), "the batch plan")
    _DigestRanks(0, {1: ([1, 2], {"seed": 0})}, world_size=2).check_same(([1, 2], {"seed": 0}), "plan")  # agree


class _DigestRanks(FakeRanks):
    """Other ranks given by the value they hold; what they contribute to a gather is its digest, as check_same's."""

    def all_gather(self, obj):
        import hashlib
        import pickle

        return [obj if r == self.rank else hashlib.sha256(pickle.dumps(self.others[r])).hexdigest()
                for r in range(self.world_size)]


def test_a_failure_posted_elsewhere_names_the_root_cause_when_the_gather_breaks():
    """Rank 0 was inside another collective (FSDP2's all-gather) when rank 1 failed: rank 0's gather breaks, and the
    failure board, not the broken collective, names what happened."""

    class Broken(FakeRanks):
        def all_gather(self, obj):
            raise RuntimeError("[gloo] Received data size doesn't match expected size")

        def failures(self, wait_s=0.0):
            return {1: "RuntimeError: engine boom"}

    with pytest.raises(RankFailure, match=r"failed on rank 1 of 2 \(rank 1: RuntimeError: engine boom\)"):
        Broken(0, {}, 2).gather_checked({"ok": 1}, None, "generating and scoring train rollouts")

    class NoBoard(Broken):
        def failures(self, wait_s=0.0):
            return {}

    with pytest.raises(RuntimeError, match="gloo"):  # nothing on the board: the collective's own error
        NoBoard(0, {}, 2).gather_checked(1, None, "x")
