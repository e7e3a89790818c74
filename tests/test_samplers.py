import torch
import pytest
from torch.utils.data import DataLoader

from common.data.samplers import (DistributedSampler, GroupedBatchSampler, InferenceSampler,
                                  ResumableBatchSampler, SampleKey, aspect_ratio_group_ids, make_batch_sampler,
                                  resolve_key)


class _Data:
    def __init__(self, n, group_ids=None):
        self.n = n
        if group_ids is not None:
            self.group_ids = group_ids

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def test_distributed_sampler_same_as_seeded_randperm():
    s = DistributedSampler(10, 1, 0, shuffle=True, seed=7)
    s.set_epoch(3)
    g = torch.Generator()
    g.manual_seed(10)
    assert list(s) == torch.randperm(10, generator=g).tolist()


def test_distributed_sampler_shards_cover_dataset_and_pad():
    shards = []
    for r in range(3):
        s = DistributedSampler(10, 3, r, shuffle=True, seed=1)
        s.set_epoch(2)
        shards.append(list(s))
    assert [len(x) for x in shards] == [4, 4, 4]
    flat = sum(shards, [])
    assert sorted(set(flat)) == list(range(10))
    # 12 slots for 10 samples: exactly 2 repeats, the first two of the global order
    order = DistributedSampler(10, 3, 0, seed=1)
    order.set_epoch(2)
    glob = order.global_order()
    assert glob[10:] == glob[:2]
    assert sorted(flat) == sorted(glob)


def test_distributed_sampler_epochs_differ_and_repeat():
    s = DistributedSampler(50, 2, 1, seed=0)
    s.set_epoch(0)
    a = list(s)
    s.set_epoch(1)
    b = list(s)
    s.set_epoch(0)
    assert list(s) == a and a != b


def test_distributed_sampler_tiny_dataset_many_ranks():
    shards = [list(DistributedSampler(2, 5, r, shuffle=False)) for r in range(5)]
    assert shards == [[0], [1], [0], [1], [0]]


def test_inference_sampler_no_duplicates():
    shards = [list(InferenceSampler(10, 3, r)) for r in range(3)]
    assert shards == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert [len(InferenceSampler(10, 3, r)) for r in range(3)] == [3, 3, 4]


def test_bad_rank_raises():
    with pytest.raises(ValueError, match="rank"):
        DistributedSampler(10, 2, 2)


def test_aspect_ratio_group_ids():
    assert aspect_ratio_group_ids([640, 480, 500], [480, 640, 500]) == [0, 1, 0]


def test_grouped_batch_sampler_groups_in_order():
    groups = [0, 1, 0, 0, 1, 1, 0, 1, 0]
    sampler = list(range(9))
    gbs = GroupedBatchSampler(sampler, groups, 2)
    batches = list(gbs)
    assert batches == [[0, 2], [1, 4], [3, 6], [5, 7], [8]]
    assert len(gbs) == 5
    assert all(len({groups[i] for i in b}) == 1 for b in batches)
    dropped = GroupedBatchSampler(sampler, groups, 2, drop_uneven=True)
    assert list(dropped) == batches[:4] and len(dropped) == 4


def test_grouped_batch_sampler_leftovers_each_group():
    groups = [0, 1, 0, 1, 0]
    assert list(GroupedBatchSampler(range(5), groups, 2)) == [[0, 2], [1, 3], [4]]
    assert list(GroupedBatchSampler(range(5), [1, 0, 1, 0, 0], 4)) == [[1, 3, 4], [0, 2]]


def test_resumable_skip_once():
    rbs = ResumableBatchSampler(torch.utils.data.BatchSampler(range(10), 3, False))
    full = list(rbs)
    rbs.skip(2)
    assert len(rbs) == 4
    assert list(rbs) == full[2:]
    assert list(rbs) == full  # skip applies to one iteration only
    with pytest.raises(ValueError):
        rbs.skip(-1)


def test_resumable_deals_batches_equally():
    inner = torch.utils.data.BatchSampler(range(10), 3, False)  # 4 batches on 3 ranks
    parts = [list(ResumableBatchSampler(inner, 3, r)) for r in range(3)]
    assert parts == [[[0, 1, 2], [9]], [[3, 4, 5], [0, 1, 2]], [[6, 7, 8], [3, 4, 5]]]
    assert [len(ResumableBatchSampler(inner, 3, r)) for r in range(3)] == [2, 2, 2]


def test_make_batch_sampler_train_resume_matches_uninterrupted():
    data = _Data(23)
    bs = make_batch_sampler(data, 4, True, world_size=2, rank=1, seed=5)
    bs.set_epoch(3)
    full = list(bs)
    fresh = make_batch_sampler(data, 4, True, world_size=2, rank=1, seed=5)
    fresh.set_epoch(3)
    fresh.skip(2)
    assert list(fresh) == full[2:]
    assert len(full) == len(bs) == 3
    loader = DataLoader(data, batch_sampler=bs)
    bs.set_epoch(3)
    assert [b.tolist() for b in loader] == full


def test_make_batch_sampler_aspect_grouping_all_ranks():
    groups = [i % 3 == 0 for i in range(20)]
    data = _Data(20, group_ids=[int(g) for g in groups])
    per_rank = []
    for r in range(2):
        bs = make_batch_sampler(data, 3, True, world_size=2, rank=r, aspect_grouping=True, seed=0)
        bs.set_epoch(1)
        per_rank.append(list(bs))
    assert len(per_rank[0]) == len(per_rank[1])
    seen = [i for part in per_rank for b in part for i in b]
    assert set(seen) == set(range(20))
    for part in per_rank:
        for b in part:
            assert len({data.group_ids[i] for i in b}) == 1
    with pytest.raises(ValueError, match="group_ids"):
        make_batch_sampler(_Data(5), 2, True, aspect_grouping=True)


def test_make_batch_sampler_eval_counts_each_sample_once():
    data = _Data(10)
    seen = []
    for r in range(3):
        seen += [i for b in make_batch_sampler(data, 2, False, world_size=3, rank=r) for i in b]
    assert sorted(seen) == list(range(10))


def test_sample_keys_carry_epoch_seed_and_skip():
    data = _Data(23)
    plain = make_batch_sampler(data, 4, True, world_size=2, rank=1, seed=5)
    keyed = make_batch_sampler(data, 4, True, world_size=2, rank=1, seed=5, sample_keys=True)
    for bs in (plain, keyed):
        bs.set_epoch(3)
    full = list(keyed)
    assert [[k.index for k in b] for b in full] == list(plain)
    assert {(k.epoch, k.seed) for b in full for k in b} == {(3, 5)}
    keyed.skip(2)
    assert list(keyed) == full[2:]
    # grouped training batches and evaluation shards are keyed too (evaluation: epoch 0)
    grouped = make_batch_sampler(_Data(6, [0, 1] * 3), 2, True, aspect_grouping=True, seed=1, sample_keys=True)
    grouped.set_epoch(2)
    assert {(k.epoch, k.seed) for b in grouped for k in b} == {(2, 1)}
    val = make_batch_sampler(data, 10, False, world_size=2, rank=1, seed=5, sample_keys=True)
    assert list(val) == [[SampleKey(i, 0, 5) for i in range(11, 21)], [SampleKey(i, 0, 5) for i in range(21, 23)]]
    # a DataLoader hands the keys to the dataset unchanged
    keyed.set_epoch(3)
    assert [[tuple(k) for k in b] for b in DataLoader(data, batch_sampler=keyed, collate_fn=list)] == \
        [[tuple(k) for k in b] for b in full]
    with pytest.raises(ValueError, match="key_seed"):
        ResumableBatchSampler(torch.utils.data.BatchSampler(range(4), 2, False), key_seed=-1)


def test_sample_key_generator_is_a_function_of_the_key():
    def draws(key):
        return torch.rand(4, generator=key.generator()).tolist()
    assert draws(SampleKey(7, 2, 0)) == draws(SampleKey(7, 2, 0))
    # neighbours whose naive sum seed + epoch + index collides still get different streams
    keys = [SampleKey(7, 2, 0), SampleKey(8, 1, 0), SampleKey(7, 1, 1), SampleKey(6, 3, 0)]
    assert len({tuple(draws(k)) for k in keys}) == len(keys)
    assert resolve_key(SampleKey(4, 0, 0))[0] == 4
    assert resolve_key(torch.tensor(4)) == (4, None)


@pytest.mark.parametrize("grouping", [False, True], ids=["sharded", "aspect-grouped"])
@pytest.mark.parametrize("old, new", [(4, 2), (1, 2), (2, 1), (2, 3)])
def test_resume_on_another_world_size_trains_every_remaining_sample_once(old, new, grouping):
    """A part-way epoch on ``old`` ranks, resumed from its consumed count on ``new`` ranks: the two
    segments train every sample of the epoch once (repeats only to even out the ranks' last batches)."""
    size, batch, done = 96, 4, 3
    data = _Data(size, group_ids=[i % 2 for i in range(size)])

    def samplers(world):
        out = [make_batch_sampler(data, batch, True, world_size=world, rank=r, seed=3, aspect_grouping=grouping)
               for r in range(world)]
        for s in out:
            s.set_epoch(2)
        return out

    first = samplers(old)
    trained = [i for s in first for b in list(s)[:done] for i in b]
    units = {s.consumed(done) for s in first}
    assert len(units) == 1  # every rank agrees
    second = samplers(new)
    for s in second:
        s.resume(units.copy().pop(), done)
    assert len({len(s) for s in second}) == 1  # ranks in lockstep
    rest = [i for s in second for b in s for i in b]
    assert len(trained) == len(set(trained)) == old * batch * done
    remaining = set(range(size)) - set(trained)
    assert remaining <= set(rest) and len(rest) - len(remaining) < new * batch


def test_a_datasets_epoch_order_replaces_randperm_and_resumes_by_units():
    class Ordered(_Data):
        def epoch_order(self, seed, epoch):
            return list(reversed(range(self.n)))[epoch:] + list(reversed(range(self.n)))[:epoch]

    data = Ordered(7)
    order = data.epoch_order(0, 2)
    ranks = [make_batch_sampler(data, 2, True, world_size=2, rank=r, seed=0) for r in range(2)]
    for s in ranks:
        s.set_epoch(2)
    assert [i for b in ranks[0] for i in b] == (order + order[:1])[0::2]
    assert [i for b in ranks[1] for i in b] == (order + order[:1])[1::2]
    single = make_batch_sampler(data, 2, True, seed=0)
    single.set_epoch(2)
    single.resume(ranks[0].consumed(1), 0)  # one batch of each rank done, resumed on one process
    assert [i for b in single for i in b] == order[4:]


@pytest.mark.parametrize("size, world, kept", [(45, 1, 5), (44, 1, 6), (45, 2, 2), (10, 3, 1)])
def test_batch_multiple_drops_only_an_odd_last_batch_and_resumes_in_step(size, world, kept):
    """Batches of 8 that must be even (Mixup): 45 -> 5 batches (the last, of 5, dropped), 44 -> 6 (the last 4
    kept), 2 ranks of 23 -> 2 each (7 dropped), 3 ranks of 4 -> 1 each; len() = the batches iterated, before
    and after a resume."""
    for rank in range(world):
        batches = make_batch_sampler(_Data(size), 8, True, world_size=world, rank=rank, seed=3, batch_multiple=2)
        batches.set_epoch(1)
        full = list(batches)
        assert len(full) == len(batches) and all(len(b) % 2 == 0 for b in full)
        per_rank = -(-size // world)
        assert sum(map(len, full)) == per_rank - batches.batch_sampler.tail()
        batches.set_epoch(1)
        batches.skip(1)
        assert len(batches) == len(full) and list(batches) == full[1:]
    assert len(full) == kept
