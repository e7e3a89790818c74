"""What each config key does here: acted on, warned about, or refused; and the check that says so.

Every key of every task's defaults has one status (a test walks the defaults and fails on a key
without one):

* ``IMPLEMENTED``: the code acts on the key with the reference release's meaning.
* ``warned(reason)``: accepted but without effect (mostly keys the reference declared and never
  read); a value other than the default logs a ``warning:`` line naming the key (logger
  ``vlbert.config``, so it reaches the console and the run's log).
* ``refused(reason)``: a value other than the default would give silently wrong results or a
  crash deep inside; :func:`check_config` stops with a :class:`~common.config.ConfigError`.

:data:`SHARED_STATUS` holds the keys of :func:`common.config.common_defaults` (engine, data builder,
trainer, optimizer). A group of keys has its table next to the function that adds it
(:data:`common.modeling.vlbert_config.VLBERT_STATUS`), and each ``<task>/function/config.py`` states
the status of its own keys, and of those it reads differently, in a ``KEY_STATUS`` table passed to
:func:`task_key_status`.
The entry points (``common.engine.train_net``, ``load_for_inference``) call the task's
``check_config(cfg)`` before anything else.
"""
import logging
from typing import Callable, NamedTuple, Optional

from yacs.config import CfgNode

from common.config import ConfigError

IMPLEMENTED, WARNED, REFUSED = "implemented", "warned", "refused"


class Status(NamedTuple):
    """Status of one key: ``kind`` is IMPLEMENTED, WARNED or REFUSED; ``reason`` is the sentence a
    warning or an error quotes; ``refuse_if`` (IMPLEMENTED keys only, see :func:`refused_if`):
    ``refuse_if(cfg) -> bool``, True when other keys make the key inapplicable."""
    kind: str
    reason: str = ""
    refuse_if: Optional[Callable] = None


DONE = Status(IMPLEMENTED)


def warned(reason):
    """Status of a key accepted without effect; ``reason`` says why (and what to do instead)."""
    return Status(WARNED, reason)


def refused(reason):
    """Status of a key whose non-default values stop the run; ``reason`` says why."""
    return Status(REFUSED, reason)


def refused_if(condition, reason):
    """Status of a key acted on unless ``condition(cfg)`` holds (another key makes it inapplicable):
    then a non-default value stops the run like a REFUSED key, quoting ``reason``."""
    return Status(IMPLEMENTED, reason, condition)


logger = logging.getLogger("vlbert.config")

_REFERENCE_UNUSED = "it has no effect (the reference release never read it either)"

SHARED_STATUS = {
    "RNG_SEED": DONE,
    "OUTPUT_PATH": DONE,
    "MODULE": DONE,
    "GPUS": warned("devices come from the launcher, one per process (torchrun LOCAL_RANK, else cuda:0 or the "
                   "CPU); the reference's one-process DataParallel over GPUS is not provided: use "
                   "scripts/dist_run_single.sh N for N GPUs"),
    "LOG_FREQUENT": DONE,
    "REPORT_TO": DONE,
    "DIST_TIMEOUT_S": DONE,
    "VAL_FREQUENT": DONE,
    "CHECKPOINT_FREQUENT": DONE,
    "MODEL_PREFIX": DONE,
    "NUM_WORKERS_PER_GPU": DONE,
    "SCALES": DONE,

    "DATASET.DATASET": DONE,
    "DATASET.LABEL_INDEX_IN_BATCH": DONE,
    "DATASET.APPEND_INDEX": DONE,
    "DATASET.PAD_TO_BATCH_MAX": DONE,
    "DATASET.DATASET_PATH": DONE,
    "DATASET.TRAIN_IMAGE_SET": DONE,
    "DATASET.VAL_IMAGE_SET": DONE,
    "DATASET.TEST_IMAGE_SET": DONE,
    "DATASET.LMDB_MODE": DONE,

    "NETWORK.PIXEL_MEANS": DONE,
    "NETWORK.PIXEL_STDS": DONE,

    "TRAIN.LR_MULT": DONE,
    "TRAIN.SHUFFLE": DONE,
    "TRAIN.FLIP_PROB": DONE,
    "TRAIN.BATCH_IMAGES": DONE,
    "TRAIN.ASPECT_GROUPING": DONE,
    "TRAIN.RESUME": DONE,
    "TRAIN.AUTO_RESUME": DONE,
    "TRAIN.BEGIN_EPOCH": DONE,
    "TRAIN.END_EPOCH": DONE,
    "TRAIN.OPTIMIZER": DONE,
    "TRAIN.CLIP_GRAD_NORM": DONE,
    "TRAIN.GRAD_ACCUMULATE_STEPS": DONE,
    "TRAIN.STRATEGY": DONE,
    "TRAIN.ASYNC_CHECKPOINT": DONE,
    "TRAIN.LR": DONE,
    "TRAIN.LR_SCHEDULE": DONE,
    "TRAIN.LR_MIN": DONE,
    # Each task says whether its loss is a softmax cross-entropy that the key smooths.
    "TRAIN.LABEL_SMOOTHING": DONE,
    "TRAIN.OPTIM_STATE_DTYPE": DONE,
    "TRAIN.LR_FACTOR": DONE,
    "TRAIN.LR_STEP": DONE,
    "TRAIN.WARMUP": DONE,
    "TRAIN.WARMUP_METHOD": DONE,
    "TRAIN.WARMUP_FACTOR": DONE,
    "TRAIN.WARMUP_STEPS": DONE,
    "TRAIN.WD": DONE,
    "TRAIN.MOMENTUM": DONE,
    "TRAIN.FP16": DONE,
    "TRAIN.FP16_LOSS_SCALE": DONE,
    "TRAIN.FP16_DTYPE": DONE,
    "TRAIN.MAX_CONSECUTIVE_SKIPS": DONE,
    "TRAIN.PROFILE": DONE,
    "TRAIN.CHECKPOINT_STEPS": DONE,
    "TRAIN.CHECKPOINT_KEEP": DONE,
    "TRAIN.CHECKPOINT_EVERY_FRACTION": DONE,
    "TRAIN.EMA_DECAY": DONE,
    "TRAIN.EARLY_STOP_METRIC": DONE,
    "TRAIN.EARLY_STOP_MODE": DONE,
    "TRAIN.EARLY_STOP_PATIENCE": DONE,
    "TRAIN.COMPILE": DONE,
    "TRAIN.LOSS_LOGGERS": DONE,

    "VAL.SHUFFLE": warned("evaluation reads the items in file order (the order predictions are combined in)"),
    "VAL.FLIP_PROB": DONE,
    "VAL.BATCH_IMAGES": DONE,
    "TEST.SHUFFLE": warned("the test set is read in file order (the order of the result file)"),
    "TEST.FLIP_PROB": DONE,
    "TEST.TEST_EPOCH": warned("the test scripts take the checkpoint file itself (--a-ckpt / --r-ckpt / --ckpt); "
                              + _REFERENCE_UNUSED),
    "TEST.BATCH_IMAGES": DONE,
}


def leaf_keys(node, prefix=""):
    """Dotted keys and values of the leaves of ``node``; a ``DATASET`` list yields each entry's
    keys under ``DATASET.`` (every entry has the same keys)."""
    for k, v in node.items():
        if isinstance(v, CfgNode):
            yield from leaf_keys(v, prefix + k + ".")
        elif k == "DATASET" and isinstance(v, list):
            for entry in v:
                yield from leaf_keys(entry, prefix + k + ".")
        else:
            yield prefix + k, v


def task_key_status(defaults, task_status, shared=()):
    """The complete status table of one task.

    Args:
        defaults (CfgNode): the task's defaults.
        task_status (dict): dotted key -> :class:`Status` of the task's own keys; it may also override
            an entry of :data:`SHARED_STATUS` or of ``shared``.
        shared (tuple of dict): the tables of the key groups the task's defaults add (e.g.
            :data:`common.modeling.vlbert_config.VLBERT_STATUS`), in order; entries of keys the task
            lacks are left out.
    Returns:
        dict: dotted key -> Status for every key of ``defaults``; a key without a status is absent
        (the completeness test reports it).
    Raises:
        ValueError: ``task_status`` names a key that ``defaults`` lacks (a misspelt key).
    """
    keys = [key for key, _ in leaf_keys(defaults)]
    unknown = sorted(set(task_status) - set(keys))
    if unknown:
        raise ValueError("KEY_STATUS names keys the defaults lack: {}".format(", ".join(unknown)))
    table = dict(SHARED_STATUS)
    for group in shared:
        table.update(group)
    table.update(task_status)
    return {key: table[key] for key in keys if key in table}


def _plain(value):
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def check_config(cfg, defaults, status, source="config"):
    """Warn about keys set without effect; stop on keys whose value would be silently wrong.

    Args:
        cfg (CfgNode): the effective config.
        defaults (CfgNode): the task's defaults (a DATASET list entry is compared with the DATASET defaults).
        status (dict): the task's table from :func:`task_key_status`.
        source (str): named in messages (the config file).
    Logs:
        one ``warning: <source>: <key> = <value>: <reason>; the value is ignored`` line per WARNED
        key whose value differs from the default.
    Raises:
        ConfigError: REFUSED keys set to non-default values, and :func:`refused_if` keys set to
            non-default values while their condition holds (all of them, in one message).
        KeyError: a key of ``cfg`` has no status (a defaults key added without one).
    """
    default_values = dict(leaf_keys(defaults))
    refusals = []
    for key, value in leaf_keys(cfg):
        entry = status.get(key)
        if entry is None:
            raise KeyError("config key {} has no status in the task's KEY_STATUS table".format(key))
        if _plain(value) == _plain(default_values[key]):
            continue
        if entry.kind == IMPLEMENTED and (entry.refuse_if is None or not entry.refuse_if(cfg)):
            continue
        message = "{}: {} = {!r}: {}".format(source, key, value, entry.reason)
        if entry.kind == WARNED:
            logger.warning("warning: %s; the value is ignored", message)
        else:
            refusals.append("{} (default {!r})".format(message, default_values[key]))
    if refusals:
        raise ConfigError("; ".join(refusals))


def key_checker(defaults_fn, status):
    """The ``check_config(cfg, source="config")`` of one task: :func:`check_config` against the task's
    defaults (``defaults_fn()``, a fresh CfgNode) and its ``KEY_STATUS`` table ``status``."""
    def check(cfg, source="config"):
        check_config(cfg, defaults_fn(), status, source)
    return check
