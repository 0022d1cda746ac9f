"""The one-process side of lit_rlft.runtime.distributed: shards, the failure protocol, metric reduction."""

from __future__ import annotations

import numpy as np
import pytest

from lit_rlft.runtime.distributed import Collective, LocalCollective, RankFailure, padded_shard, shard_slice


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


class _Board(FakeRanks):
    """A collective with a failure board: records what it gathered, and the failures posted (this rank's and the
    ``posted`` ones of other ranks, in order)."""

    def __init__(self, rank, others, world_size, posted=None):
        super().__init__(rank, others, world_size)
        self.board = dict(posted or {})
        self.gathered = []

    def all_gather(self, obj):
        self.gathered.append(obj)
        return super().all_gather(obj)

    def post_failure(self, detail):
        self.board[self.rank] = detail
        return True

    def failures(self, wait_s=0.0):
        return dict(self.board)


def test_a_failed_rank_posts_its_failure_and_joins_the_gather_so_every_rank_raises_together():
    # rank 1 failed: it posts, gathers (detail, None) and raises naming every failed rank, as the healthy ranks do
    coll = _Board(1, {0: (None, {"ok": 1}), 2: ("KeyError: 'y'", None)}, world_size=3, posted={2: "KeyError: 'y'"})
    with pytest.raises(RankFailure, match=r"scoring failed on rank 2, 1 of 3 \(rank 2: KeyError: 'y'; rank 1: "
                                          r"ValueError: boom\)") as exc:
        coll.gather_checked(None, ValueError("boom"), "scoring")
    assert coll.gathered == [("ValueError: boom", None)]  # it joined, with its failure
    assert coll.board[1] == "ValueError: boom"  # and posted it for ranks inside another collective
    assert isinstance(exc.value.__cause__, ValueError)
    # rank 0's view of the same gather: the same ranks, first failure first
    coll = _Board(0, {1: ("ValueError: boom", None), 2: ("KeyError: 'y'", None)}, world_size=3,
                  posted={2: "KeyError: 'y'", 1: "ValueError: boom"})
    with pytest.raises(RankFailure, match=r"scoring failed on rank 2, 1 of 3"):
        coll.gather_checked({"ok": 1}, None, "scoring")


def test_join_false_posts_the_failure_and_raises_without_entering_the_gather():
    """A failure while generating with an FSDP2-sharded policy: the others are inside the forward passes'
    all-gathers, so the failed rank must not enter a gather of its own (they read its failure from the board)."""
    coll = _Board(1, {0: (None, {"ok": 1})}, world_size=2)
    with pytest.raises(RankFailure, match=r"generating failed on rank 1 of 2 \(rank 1: RuntimeError: engine boom\)"):
        coll.gather_checked(None, RuntimeError("engine boom"), "generating", join=False)
    assert coll.gathered == [] and coll.board == {1: "RuntimeError: engine boom"}
    # a healthy rank gathers whatever join says; without a board a failed rank gathers even with join=False
    assert _Board(0, {1: (None, 7)}, 2).gather_checked(3, None, "x", join=False) == [3, 7]
    with pytest.raises(RankFailure, match="failed on rank 1 of 2"):
        FakeRanks(1, {0: (None, 3)}, 2).gather_checked(None, KeyError("x"), "x", join=False)
