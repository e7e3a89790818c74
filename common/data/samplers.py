"""Samplers: deterministic per-epoch shuffling, unpadded evaluation shards, aspect-ratio
batching and a resumable batch sampler.

The training order of an epoch depends only on ``(seed, epoch)``, never on a global RNG,
so a job resumed in the middle of an epoch reproduces that epoch's order and skips the
batches it has already trained on without loading them (``ResumableBatchSampler.skip``).
Random augmentation follows the same rule: a batch sampler can hand the dataset
``SampleKey(index, epoch, seed)`` instead of a bare index, and the dataset draws every random
decision of that sample from ``key.generator()``, so a decision never depends on which worker,
rank or resumed process loads the sample.
Ideas from maskrcnn-benchmark (``data/samplers``) and detectron2 (``InferenceSampler``).
"""
import math
from collections import defaultdict, namedtuple

import numpy as np
import torch
from torch.utils.data.sampler import BatchSampler, Sampler


class SampleKey(namedtuple("SampleKey", "index epoch seed")):
    """What a keyed batch sampler yields for one sample: dataset ``index``, training ``epoch``
    and base ``seed`` (``max(RNG_SEED, 0)``), all ints >= 0.

    The index is the global dataset index, so the key (and every random decision drawn from
    it) is the same on whatever rank, worker or resumed process the sample is loaded.
    """
    __slots__ = ()

    def generator(self):
        """A fresh ``torch.Generator`` seeded from ``(seed, epoch, index)``.

        The three ints go through numpy's ``SeedSequence`` hash, so nearby keys (index i of
        epoch e+1 vs index i+1 of epoch e) get unrelated streams, unlike ``seed + epoch + index``.
        """
        state = np.random.SeedSequence([self.seed, self.epoch, self.index]).generate_state(1, np.uint64)
        return torch.Generator().manual_seed(int(state[0]))


def resolve_key(key):
    """``(index, generator)`` for what a dataset's ``__getitem__`` receives.

    A ``SampleKey`` gives its index and ``key.generator()``; a plain int (direct indexing)
    gives ``(key, None)``: random transforms then draw from torch's global RNG.
    """
    if isinstance(key, SampleKey):
        return key.index, key.generator()
    return int(key), None


def _check_rank(num_replicas, rank):
    if num_replicas < 1 or not 0 <= rank < num_replicas:
        raise ValueError("rank must be in [0, num_replicas), got rank={} num_replicas={}".format(rank, num_replicas))


class DistributedSampler(Sampler):
    """Indices of one rank's share of the dataset, reshuffled each epoch from ``seed + epoch``.

    The permutation of ``range(size)`` is padded by repeating its first indices to a
    multiple of ``num_replicas`` so that every rank sees ``ceil(size / num_replicas)``
    samples (equal step counts keep DDP in lockstep); rank ``r`` takes positions
    ``r, r + num_replicas, ...``. With ``num_replicas=1`` it is a seeded random sampler.

    ``start`` (0 unless a resume sets it) drops the first ``start`` positions of the epoch's
    permutation, already trained before an interruption, and shards only the rest the same way: a
    run resumed on another number of processes trains each remaining sample once.

    Args:
        size (int): number of samples in the dataset.
        num_replicas (int): world size.
        rank (int): this process's rank.
        shuffle (bool): permute with ``torch.randperm`` seeded by ``seed + epoch`` (or ``order``); else in order.
        seed (int): base seed, identical on every rank.
        order (callable or None): ``order(seed, epoch)`` -> the epoch's permutation of ``range(size)`` (a
            sequence of int), used instead of ``torch.randperm`` when shuffling: a data set whose reads should
            follow its storage (tar shards: ``common.data.tar_shards.epoch_order``) gives its own.
    """

    def __init__(self, size, num_replicas=1, rank=0, shuffle=True, seed=0, order=None):
        _check_rank(num_replicas, rank)
        self.size = int(size)
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = int(seed)
        self.order = order
        self.epoch = 0
        self.start = 0

    @property
    def num_samples(self):
        """Samples of this rank in the current epoch (after ``start``)."""
        return int(math.ceil(max(self.size - self.start, 0) / self.num_replicas))

    def set_epoch(self, epoch):
        """Select the permutation of ``epoch`` (call before iterating each epoch)."""
        self.epoch = int(epoch)

    def global_order(self):
        """The padded order over all ranks for the current epoch, from position ``start`` (list of int)."""
        if self.shuffle and self.order is not None:
            order = [int(i) for i in self.order(self.seed, self.epoch)]
        elif self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.size, generator=g).tolist()
        else:
            order = list(range(self.size))
        rest = order[self.start:]
        total = self.num_samples * self.num_replicas
        while len(rest) < total:  # loop: the pad can exceed size when size < num_replicas
            rest += order[:total - len(rest)]
        return rest

    def __iter__(self):
        return iter(self.global_order()[self.rank::self.num_replicas])

    def __len__(self):
        return self.num_samples


class InferenceSampler(Sampler):
    """Contiguous, unpadded shard of ``range(size)`` for evaluation: each sample on exactly one rank.

    Rank ``r`` gets ``range(r * size // n, (r + 1) * size // n)``, so shard lengths differ by at
    most one and no sample is repeated (a padded sampler would count padded samples twice).
    """

    def __init__(self, size, num_replicas=1, rank=0):
        _check_rank(num_replicas, rank)
        self.begin = rank * size // num_replicas
        self.end = (rank + 1) * size // num_replicas

    def __iter__(self):
        return iter(range(self.begin, self.end))

    def __len__(self):
        return self.end - self.begin


def aspect_ratio_group_ids(widths, heights):
    """Aspect-ratio bucket per image: 0 when ``width >= height`` (landscape or square), else 1.

    Args:
        widths, heights: sequences of image sizes in pixels, same length.
    Returns:
        list of int, one group id per image.
    """
    if len(widths) != len(heights):
        raise ValueError("got {} widths but {} heights".format(len(widths), len(heights)))
    return [0 if w >= h else 1 for w, h in zip(widths, heights)]


class GroupedBatchSampler(BatchSampler):
    """Batches whose samples all share a group id (aspect-ratio bucket), in sampler order.

    Indices are read from ``sampler`` in its order and put in one buffer per group; a buffer
    is emitted as a batch as soon as it holds ``batch_size`` indices. The partial buffers left
    at the end are emitted last (by group id) unless ``drop_uneven``. Padding less images to the
    same shape wastes less compute (maskrcnn-benchmark ``GroupedBatchSampler``, same idea).

    Args:
        sampler (Sampler): yields dataset indices.
        group_ids (sequence of int): group of every dataset index.
        batch_size (int): samples per batch.
        drop_uneven (bool): drop the final batches smaller than ``batch_size``.
    """

    def __init__(self, sampler, group_ids, batch_size, drop_uneven=False):
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1, got {}".format(batch_size))
        self.sampler = sampler
        self.group_ids = [int(g) for g in group_ids]
        self.batch_size = batch_size
        self.drop_uneven = drop_uneven

    def __iter__(self):
        buffers = defaultdict(list)
        for idx in self.sampler:
            buf = buffers[self.group_ids[idx]]
            buf.append(idx)
            if len(buf) == self.batch_size:
                yield list(buf)
                buf.clear()
        if not self.drop_uneven:
            for group in sorted(buffers):
                if buffers[group]:
                    yield buffers[group]

    def __len__(self):
        counts = defaultdict(int)
        for idx in self.sampler:
            counts[self.group_ids[idx]] += 1
        if self.drop_uneven:
            return sum(c // self.batch_size for c in counts.values())
        return sum(int(math.ceil(c / self.batch_size)) for c in counts.values())


class MultipleBatchSampler(BatchSampler):
    """torch's ``BatchSampler`` (last batch kept) whose last batch is dropped when its size is not a multiple of
    ``multiple``: timm's Mixup / CutMix mixes a batch with its reverse and needs an even one.

    Args:
        sampler (Sampler): yields dataset indices.
        batch_size (int): samples per batch (a multiple of ``multiple``).
        multiple (int): every batch holds a multiple of this many samples (>= 1).
    Raises:
        ValueError: ``batch_size`` is not a multiple of ``multiple``.
    """

    def __init__(self, sampler, batch_size, multiple):
        if multiple < 1 or batch_size % multiple:
            raise ValueError("the batch size {} is not a multiple of {}".format(batch_size, multiple))
        super().__init__(sampler, batch_size, drop_last=False)
        self.multiple = multiple

    def tail(self, samples=None):
        """Samples of the last, dropped batch of an epoch of ``samples`` samples (default ``len(sampler)``); 0 when
        none is dropped."""
        tail = (len(self.sampler) if samples is None else samples) % self.batch_size
        return tail if tail % self.multiple else 0

    def __iter__(self):
        for batch in super().__iter__():
            if len(batch) % self.multiple == 0:  # only the last batch can be short
                yield batch

    def __len__(self):
        return num_batches(self, len(self.sampler))


def num_batches(batch_sampler, samples):
    """Batches that ``batch_sampler`` (torch's ``BatchSampler`` or :class:`MultipleBatchSampler`) makes of
    ``samples`` samples."""
    full, tail = divmod(samples, batch_sampler.batch_size)
    if not tail or batch_sampler.drop_last or tail % getattr(batch_sampler, "multiple", 1):
        return full
    return full + 1


class ResumableBatchSampler(Sampler):
    """Wraps a batch sampler: forwards ``set_epoch``, can resume an epoch part-way, can deal whole
    batches out to ranks, and can turn indices into ``SampleKey``s.

    With ``num_replicas > 1`` the wrapped sampler is a global one; its batch list is padded by
    repeating its first batches to a multiple of ``num_replicas`` and rank ``r`` takes batches
    ``r, r + num_replicas, ...``, so every rank runs the same number of steps even when the
    batches come from per-group buffers.

    Progress through an epoch is counted in units of the epoch's *global* order, the same on
    every rank whatever the number of processes: samples of the permutation when the wrapped
    sampler batches a ``DistributedSampler``, global batches when it deals batches out.
    ``consumed(n)`` is the units trained after this rank's ``n``-th batch; ``resume(units, n)``
    makes the next iteration start after ``units`` and re-shards the rest over the current ranks
    (used once, then reset), so a run checkpointed on W processes resumes on any other number
    and trains every remaining sample once. ``skip(n)`` resumes after this rank's first ``n``
    batches of an unchanged layout.

    ``len()`` is the epoch length on this rank with the batches already done counted in, so
    schedules computed from ``len(loader)`` do not change on a resume with the same layout.

    Args:
        batch_sampler: yields lists of dataset indices.
        num_replicas, rank (int): deal batches out to ranks (see above).
        key_seed (int or None): if set, batches are lists of ``SampleKey(index, epoch, key_seed)``
            (``epoch`` as last given to ``set_epoch``, 0 before) instead of ints.
    """

    def __init__(self, batch_sampler, num_replicas=1, rank=0, key_seed=None):
        _check_rank(num_replicas, rank)
        if key_seed is not None and key_seed < 0:
            raise ValueError("key_seed must be >= 0 (use max(RNG_SEED, 0)), got {}".format(key_seed))
        self.batch_sampler = batch_sampler
        self.num_replicas = num_replicas
        self.rank = rank
        self.key_seed = key_seed
        self.epoch = 0
        # (units of the global order, batches counted as done): of the iteration under way, and of the next
        # one when a resume is pending
        self._active, self._pending = (0, 0), None

    def set_epoch(self, epoch):
        """Record the epoch (for sample keys) and forward it to the innermost sampler that has
        ``set_epoch``."""
        self.epoch = int(epoch)
        self._active = (0, 0)
        inner = getattr(self.batch_sampler, "sampler", None)
        for obj in (self.batch_sampler, inner):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)
                return

    def _sample_sharded(self):
        """The ``DistributedSampler`` under a ``BatchSampler``, when batches are formed per rank; else None."""
        inner = getattr(self.batch_sampler, "sampler", None)
        per_rank = self.num_replicas == 1 and not isinstance(self.batch_sampler, GroupedBatchSampler)
        return inner if per_rank and isinstance(inner, DistributedSampler) else None

    def _unit(self):
        """Units of the global order that one batch of every rank consumes."""
        inner = self._sample_sharded()
        if inner is None:
            return self.num_replicas
        return self.batch_sampler.batch_size * inner.num_replicas

    def consumed(self, num_batches):
        """Units of the epoch's global order trained once this rank has done ``num_batches`` batches of
        the iteration under way (counted as ``len()`` counts them). An int, identical on every rank."""
        units, done = self._active
        return units + (num_batches - done) * self._unit()

    def resume(self, units, num_batches):
        """Start the next iteration (only) after ``units`` of the global order, counting ``num_batches``
        batches as done on this rank (``len()`` and ``consumed`` count them in).

        Raises:
            ValueError: a negative count.
        """
        if units < 0 or num_batches < 0:
            raise ValueError("cannot resume at a negative position ({} units, {} batches)".format(units, num_batches))
        self._pending = (int(units), int(num_batches))

    def skip(self, num_batches):
        """Skip the first ``num_batches`` batches of the next iteration only (int >= 0), same layout."""
        if num_batches < 0:
            raise ValueError("cannot skip a negative number of batches ({})".format(num_batches))
        self.resume(num_batches * self._unit(), num_batches)

    def _batches(self, units):
        batches = list(self.batch_sampler)
        if self._sample_sharded() is not None:
            return batches
        rest = batches[units:]
        total = int(math.ceil(len(rest) / self.num_replicas)) * self.num_replicas
        while len(rest) < total:  # padded with the epoch's first batches, as without a resume
            rest += batches[:total - len(rest)]
        return rest[self.rank::self.num_replicas]

    def __iter__(self):
        self._active, self._pending = self._pending or (0, 0), None
        inner = self._sample_sharded()
        if inner is not None:
            inner.start = self._active[0]
        epoch, seed = self.epoch, self.key_seed
        for batch in self._batches(self._active[0]):
            yield batch if seed is None else [SampleKey(int(j), epoch, seed) for j in batch]

    def __len__(self):
        units, done = self._pending or self._active
        inner = self._sample_sharded()
        if inner is None:
            remaining = max(len(self.batch_sampler) - units, 0)
            return done + int(math.ceil(remaining / self.num_replicas))
        samples = int(math.ceil(max(inner.size - units, 0) / inner.num_replicas))
        return done + num_batches(self.batch_sampler, samples)


def make_batch_sampler(dataset, batch_size, is_train, world_size=1, rank=0, shuffle=None,
                       aspect_grouping=False, seed=0, drop_last=False, sample_keys=False, batch_multiple=1):
    """Build the per-rank batch sampler of a loader.

    Training (``is_train``): a ``ResumableBatchSampler`` over a seeded ``DistributedSampler``
    (call ``set_epoch`` every epoch, ``skip`` to resume). With ``aspect_grouping``, batches are
    formed from the global order by ``GroupedBatchSampler`` using ``dataset.group_ids`` (see
    ``aspect_ratio_group_ids``) and dealt out to ranks whole. A dataset with an ``epoch_order(seed, epoch)``
    method gives the shuffled order of each epoch itself (see ``DistributedSampler``). Evaluation: batches over an
    ``InferenceSampler`` shard (no duplicates; ranks may get one batch more or less).

    Args:
        dataset: map-style dataset (``len`` and, for aspect grouping, ``group_ids``).
        batch_size (int): samples per batch on one rank (``TRAIN.BATCH_IMAGES``).
        is_train (bool): training or evaluation sampler.
        world_size, rank (int): data-parallel layout.
        shuffle (bool or None): shuffle the training order; ``None`` means ``is_train``.
        aspect_grouping (bool): group samples by aspect ratio (training only).
        seed (int): base seed of the shuffle and of the sample keys, identical on all ranks
            (``max(RNG_SEED, 0)``).
        drop_last (bool): drop the last incomplete batch (or uneven group batches).
        sample_keys (bool): yield ``SampleKey(index, epoch, seed)`` instead of ints, for datasets
            that draw their augmentation from ``key.generator()`` (evaluation keys have epoch 0).
        batch_multiple (int): training batches hold a multiple of this many samples: the last batch of an
            epoch that does not is dropped (:class:`MultipleBatchSampler`); ``batch_size`` must be one.
    Returns:
        a batch sampler to pass as ``DataLoader(batch_sampler=...)``.
    Raises:
        ValueError: aspect grouping on a dataset without ``group_ids`` of the right length, or with
            ``batch_multiple`` > 1 (its per-group last batches are not checked).
    """
    size = len(dataset)
    key_seed = seed if sample_keys else None
    if not is_train:
        shard = BatchSampler(InferenceSampler(size, world_size, rank), batch_size, drop_last)
        return ResumableBatchSampler(shard, key_seed=key_seed) if sample_keys else shard
    shuffle = is_train if shuffle is None else shuffle
    epoch_order = getattr(dataset, "epoch_order", None)
    if aspect_grouping:
        if batch_multiple > 1:
            raise ValueError("aspect grouping keeps every group's last batch: it cannot hold batches to a "
                             "multiple of {} samples".format(batch_multiple))
        group_ids = getattr(dataset, "group_ids", None)
        if group_ids is None or len(group_ids) != size:
            raise ValueError("aspect grouping needs {}.group_ids with one id per sample ({} samples)".format(
                type(dataset).__name__, size))
        order = DistributedSampler(size, 1, 0, shuffle=shuffle, seed=seed, order=epoch_order)
        return ResumableBatchSampler(GroupedBatchSampler(order, group_ids, batch_size, drop_last), world_size, rank,
                                     key_seed=key_seed)
    sampler = DistributedSampler(size, world_size, rank, shuffle=shuffle, seed=seed, order=epoch_order)
    batches = (MultipleBatchSampler(sampler, batch_size, batch_multiple) if batch_multiple > 1 and not drop_last
               else BatchSampler(sampler, batch_size, drop_last))
    return ResumableBatchSampler(batches, key_seed=key_seed)
