"""Several data sets in one training step: a config with a ``DATASET`` list (multi-task pretraining).

Each entry of ``DATASET`` gets its own loader with its own ``{TRAIN,VAL,TEST}.BATCH_IMAGES`` entry
(:func:`dataset_configs`). :class:`MultiTaskDataLoader` yields, per step, the batch of the first
loader followed by one batch of each other loader, concatenated into one tuple (the reference's
``MultiTaskDataLoader`` layout). The first loader defines the epoch; the others cycle.

Exact resume without extra state: step ``b`` of epoch ``e`` is global step ``g = e * n0 + b``
(``n0 = len(first loader)``); another loader of length ``n`` is then in its own epoch ``g // n``
at batch ``g % n``. Both are derived again on resume, so every loader restarts where an
uninterrupted run would be, and each loader's ``set_epoch`` receives its own epoch (its shuffle
and its samples' random draws depend on it).

Evaluation (:class:`MultiTaskEvalLoader`) reads every data set once, in full, on any number of
processes: the reference truncated the later data sets to the first one's length.
"""
import itertools

import torch

from common.data.collate import num_samples
from common.errors import UserInputError

MODES = ("TRAIN", "VAL", "TEST")


class MultiTaskConfigError(UserInputError):
    """A ``BATCH_IMAGES`` list whose length does not match the ``DATASET`` list."""


def dataset_configs(cfg, source="config"):
    """One frozen config per ``DATASET`` entry: ``DATASET`` is that entry and every
    ``{TRAIN,VAL,TEST}.BATCH_IMAGES`` its entry of the list (an int is used for every data set).

    Args:
        cfg: frozen CfgNode whose ``DATASET`` is a list of CfgNodes.
        source: config file name, for errors.
    Returns:
        list of CfgNode, in ``DATASET`` order.
    Raises:
        MultiTaskConfigError: a ``BATCH_IMAGES`` list with another length than ``DATASET``.
    """
    out = []
    for i, entry in enumerate(cfg.DATASET):
        sub = cfg.clone()
        sub.defrost()
        sub.DATASET = entry.clone()
        for mode in MODES:
            size = cfg[mode].BATCH_IMAGES
            if isinstance(size, (list, tuple)):
                if len(size) != len(cfg.DATASET):
                    raise MultiTaskConfigError("{}: {}.BATCH_IMAGES has {} entries for {} DATASET entries".format(
                        source, mode, len(size), len(cfg.DATASET)))
                sub[mode].BATCH_IMAGES = int(size[i])
        sub.freeze()
        out.append(sub)
    return out


class _Position:
    """The multi-task loader's ``batch_sampler`` face for the trainer: ``set_epoch`` and ``skip``."""

    def __init__(self):
        self.epoch = 0
        self.skip_batches = 0

    def set_epoch(self, epoch):
        """Select the epoch of the first loader (the others follow, see the module docstring)."""
        self.epoch = int(epoch)

    def skip(self, num_batches):
        """Start the next iteration at batch ``num_batches`` of the epoch (one-shot)."""
        if num_batches < 0:
            raise ValueError("cannot skip a negative number of batches ({})".format(num_batches))
        self.skip_batches = int(num_batches)


class MultiTaskDataLoader:
    """Iterates several DataLoaders in step; see the module docstring.

    Args:
        loaders: DataLoaders (at least one) whose ``batch_sampler`` has ``set_epoch(epoch)`` and
            ``skip(n)`` (``common.data.samplers.ResumableBatchSampler``).

    ``len()`` is the first loader's length; each item is the tuple concatenation of one batch per
    loader. ``batch_sampler.set_epoch(e)`` / ``batch_sampler.skip(m)`` act as on a single loader.
    ``dataset`` is the first loader's data set; ``num_samples(batch)`` counts the samples of every data set.

    Raises:
        ValueError: no loader, or a loader (other than the first) of length 0.
    """

    def __init__(self, loaders):
        self.loaders = list(loaders)
        if not self.loaders:
            raise ValueError("MultiTaskDataLoader needs at least one loader")
        empty = [i for i, loader in enumerate(self.loaders[1:], 1) if len(loader) == 0]
        if empty:
            raise ValueError("data set(s) {} of the DATASET list have no batch".format(empty))
        self.batch_sampler = _Position()
        self.dataset = self.loaders[0].dataset
        self.widths = None  # fields of each loader's batch, known from the first item

    def num_samples(self, batch):
        """Samples of all data sets in ``batch`` (an item of this loader): each data set's part counted by
        :func:`common.data.collate.num_samples`, summed (what the throughput and TensorBoard count)."""
        total, start = 0, 0
        for width in self.widths:
            total += num_samples(batch[start:start + width])
            start += width
        return total

    def __len__(self):
        return len(self.loaders[0])

    def positions(self, epoch, batch):
        """``[(epoch_k, batch_k), ...]``: where each loader is at step ``batch`` of ``epoch``."""
        step = epoch * len(self) + batch
        return [(epoch, batch)] + [divmod(step, len(loader)) for loader in self.loaders[1:]]

    @staticmethod
    def _start(loader, epoch, batch):
        loader.batch_sampler.set_epoch(epoch)
        if batch:
            loader.batch_sampler.skip(batch)
        return iter(loader)

    def _cycle(self, loader, epoch, batch):
        """Batches of ``loader`` from ``batch`` of its ``epoch`` on, going on into its next epochs."""
        for e in itertools.count(epoch):
            yield from self._start(loader, e, batch if e == epoch else 0)

    def __iter__(self):
        start, self.batch_sampler.skip_batches = self.batch_sampler.skip_batches, 0
        (epoch, _), *others = self.positions(self.batch_sampler.epoch, start)
        first = self._start(self.loaders[0], epoch, start)
        cycles = [self._cycle(loader, e, b) for loader, (e, b) in zip(self.loaders[1:], others)]
        for batch in first:
            parts = [tuple(batch)] + [tuple(next(cycle)) for cycle in cycles]
            self.widths = [len(part) for part in parts]
            yield sum(parts, ())


def ignored_labels(dataset, batch):
    """``batch`` of ``dataset`` with its label fields set to the values its metrics and losses skip
    (``dataset.ignored_labels``: field name -> value; e.g. MLM labels -1).

    Raises:
        UserInputError: the data set declares no ``ignored_labels``.
    """
    values = getattr(dataset, "ignored_labels", None)
    if values is None:
        raise UserInputError("{} declares no ignored_labels, so a DATASET list cannot evaluate it next to a data "
                             "set of another length".format(type(dataset).__name__))
    return tuple(torch.full_like(field, values[name]) if name in values else field
                 for name, field in zip(dataset.data_names, batch))


class MultiTaskEvalLoader:
    """Evaluation over a ``DATASET`` list: every data set read once, in full, on any number of processes.

    Each item is the concatenation of one batch per loader (the training layout, which the multi-task
    model needs). It has as many items as the longest loader on this rank; a data set that has run out
    (or whose shard here is empty) fills its place with a one-sample batch of its first item whose labels
    are ignored (:func:`ignored_labels`), so it counts for nothing. Each loader's own sampler shards its
    data set over the ranks without repeats, so the metrics summed over ranks count every sample once.

    Args:
        loaders: evaluation DataLoaders, one per data set, in ``DATASET`` order.
    """

    def __init__(self, loaders):
        self.loaders = list(loaders)
        if not self.loaders:
            raise ValueError("MultiTaskEvalLoader needs at least one loader")
        self.dataset = self.loaders[0].dataset

    def __len__(self):
        return max(len(loader) for loader in self.loaders)

    @staticmethod
    def _filler(loader):
        with torch.random.fork_rng(devices=[]):  # the item's random draws leave no trace on the run's RNG
            batch = loader.collate_fn([loader.dataset[0]])
        return ignored_labels(loader.dataset, batch)

    def __iter__(self):
        iterators = [iter(loader) for loader in self.loaders]
        fillers = [None] * len(self.loaders)
        for _ in range(len(self)):
            parts = []
            for k, (loader, iterator) in enumerate(zip(self.loaders, iterators)):
                batch = next(iterator, None)
                if batch is None:
                    if fillers[k] is None:
                        fillers[k] = self._filler(loader)
                    batch = fillers[k]
                parts.append(tuple(batch))
            yield sum(parts, ())
