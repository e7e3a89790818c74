"""One data builder for every task: dataset -> sampler -> batch sampler -> DataLoader.

A task registers its dataset class under the ``DATASET.DATASET`` name it answers to
(``register_dataset('vcr', VCRDataset)``, done by importing ``vcr.data``). The class
provides ``from_config(cfg, mode, transform)`` and ``data_names``, and its ``__getitem__``
takes a ``SampleKey`` (``common.data.samplers.resolve_key`` turns it into the index and the
generator its random transforms draw from); everything else here is shared
(maskrcnn-benchmark ``data/build.py`` has the same shape). A dataset whose model tells padding by values other
than :data:`common.data.collate.DEFAULT_PAD_VALUES` names them in a ``pad_values`` attribute
(``{field name: pad value}``). ``tools/check_data.py`` uses two optional methods: ``item_source(index)``
-> ``(file, jsonl line from 1 | {'index': n} | other dict)`` where the item is defined, and ``check_item(index)``,
a cheaper read of the item than ``__getitem__`` that raises the same errors (VCR: image headers only).
"""
import torch
from torch.utils.data import DataLoader

from common.registry import Registry
from common.runtime.logs import get_logger
from common.runtime.preemption import worker_ignore_stop_signals

from .collate import BatchCollator, canvas_scales
from .samplers import make_batch_sampler
from .transforms import build_transforms

DATASETS = Registry("dataset", key="DATASET.DATASET",
                    hint=" (import the task's data package, e.g. vcr.data, to register it)")
MODES = ("train", "val", "test")
logger = get_logger(__name__)


def register_dataset(name, cls):
    """Make ``cls`` the dataset of ``DATASET.DATASET == name``; ValueError on a second one."""
    return DATASETS.register(cls, name)


def build_dataset(cfg, mode):
    """The registered dataset of ``cfg.DATASET.DATASET`` for ``mode``, with the config's transforms.

    Raises:
        KeyError: unknown dataset name (the message lists the registered ones).
    """
    if mode not in MODES:
        raise ValueError("mode must be one of {}, got {!r}".format(MODES, mode))
    cls = DATASETS.get(cfg.DATASET.DATASET)
    return cls.from_config(cfg, mode, build_transforms(cfg, mode))


def _batch_size(cfg, mode):
    size = cfg[mode.upper()].BATCH_IMAGES
    if isinstance(size, (list, tuple)):
        raise ValueError("{}.BATCH_IMAGES is a list ({}): one entry per data set is for the multi-task "
                         "pretraining loader, not a single data set".format(mode.upper(), list(size)))
    return int(size)


def make_dataloader(cfg, mode="train", world_size=1, rank=0, dataset=None, batch_multiple=(1, "")):
    """DataLoader of one rank for ``mode``.

    Per process: ``{MODE}.BATCH_IMAGES`` samples per batch and ``NUM_WORKERS_PER_GPU``
    workers (one process per device, as the reference's distributed mode). Training uses
    ``TRAIN.SHUFFLE`` seeded by ``max(RNG_SEED, 0)`` (call ``loader.batch_sampler.set_epoch``
    every epoch and ``.skip(n)`` to resume mid-epoch) and ``TRAIN.ASPECT_GROUPING``;
    evaluation shards the data without padding so each sample is seen once. Images are
    padded to the fixed ``SCALES`` canvas unless ``DATASET.PAD_TO_BATCH_MAX``
    (:func:`common.data.collate.canvas_scales`).

    The dataset receives ``SampleKey(index, epoch, max(RNG_SEED, 0))`` items (epoch 0 in
    evaluation) and draws its random augmentation from ``key.generator()``: a flip depends on
    the seed, the epoch and the sample only, never on the worker, the rank count or a resume. Workers leave
    SIGTERM and SIGUSR1 to their rank process (:func:`common.runtime.preemption.worker_ignore_stop_signals`).

    Args:
        cfg: frozen CfgNode of the task.
        mode: ``'train'``, ``'val'`` or ``'test'``.
        world_size, rank: data-parallel layout.
        dataset: use this dataset instead of building one from ``cfg`` (it must accept
            ``SampleKey`` indices, see the module docstring).
        batch_multiple: ``(m, reason)`` of :meth:`common.task.Task.train_batch_multiple`: training batches
            hold a multiple of ``m`` samples; a last batch of an epoch that does not is dropped, and one log
            line says so, with ``reason``.
    Returns:
        ``torch.utils.data.DataLoader`` yielding :class:`common.data.collate.Batch` tuples in
        ``dataset.data_names`` order (plus the in-batch index when ``DATASET.APPEND_INDEX``), with the
        extras of the dataset's ``batch_extras`` (name -> function of the fields by name), if any.
    """
    if dataset is None:
        dataset = build_dataset(cfg, mode)
    is_train = mode == "train"
    multiple, reason = batch_multiple if is_train else (1, "")
    batch_sampler = make_batch_sampler(
        dataset, _batch_size(cfg, mode), is_train, world_size=world_size, rank=rank,
        shuffle=cfg.TRAIN.SHUFFLE if is_train else False,
        aspect_grouping=is_train and cfg.TRAIN.ASPECT_GROUPING, seed=max(cfg.RNG_SEED, 0), sample_keys=True,
        batch_multiple=multiple)
    tail = getattr(batch_sampler.batch_sampler, "tail", lambda: 0)() if is_train else 0
    if tail and rank == 0:
        logger.info("the last training batch of each epoch would hold %d sample(s), not a multiple of %d: it is "
                    "dropped (%d of %d samples per process and epoch are not trained; %s)", tail, multiple, tail,
                    len(batch_sampler.batch_sampler.sampler), reason)
    workers = cfg.NUM_WORKERS_PER_GPU
    # Own generator: creating an iterator then draws its worker seed from it, not from the
    # global RNG that a resumed run restores (exact mid-epoch resume).
    return DataLoader(dataset, batch_sampler=batch_sampler, num_workers=workers, generator=torch.Generator(),
                      collate_fn=BatchCollator(dataset.data_names, pad_values=getattr(dataset, "pad_values", None),
                                               append_ind=cfg.DATASET.APPEND_INDEX, scales=canvas_scales(cfg),
                                               extras=getattr(dataset, "batch_extras", None)),
                      pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0,
                      worker_init_fn=worker_ignore_stop_signals)
