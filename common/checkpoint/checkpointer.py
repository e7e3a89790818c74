"""Checkpoints: atomic saving, safe loading and exact resume (partial pretrain loading:
common.checkpoint.partial_pretrain).

File layout (the reference release's, plus mid-epoch files of our own)::

    {prefix}-{epoch:04d}.model                  after epoch ``epoch`` (0-based)
    {prefix}-best.model                         copy of the best validation epoch
    {prefix}-{epoch:04d}-b{batches:07d}.model   inside epoch ``epoch``, ``batches`` micro-batches done

Each file is a dict. The reference's keys come first: ``state_dict`` (model, fp32, no
``module.`` prefix), ``optimizer``, ``validation_monitor``; ours follow: ``amp`` (loss scaler),
``lr_scheduler``, ``rng`` (one entry per rank), ``train_state`` (epoch, batches done in the
epoch, optimizer steps) and ``config`` (YAML text). Everything is plain tensors and builtins,
so the weights-only reader of :mod:`common.fileio.safe_load` reads it without running code from the file.

The checkpointer layout follows maskrcnn-benchmark ``utils/checkpoint.py``; files are written
atomically by :mod:`common.fileio.safe_write` and read by :mod:`common.fileio.safe_load`.
"""
import collections
import logging
import os
import re
import shutil
from dataclasses import dataclass
from typing import List, Optional

import torch
import yaml
from torch.distributed.checkpoint import CheckpointException

from common.checkpoint.rng import rng_state, set_rng_state
from common.checkpoint.sharded import (is_sharded_checkpoint, load_into, read_index, read_sharded_checkpoint,
                                       save_sharded_checkpoint, slot_key)
from common.checkpoint.train_state import check_train_state, new_train_state
from common.errors import CheckpointError
from common.fileio.safe_load import UnreadableFileError, load_tensors
from common.fileio.safe_write import OutputWriteError, atomic_write
from common.parallel.fsdp import gather_full, is_sharded, shard_like, shard_optimizer_state
from common.runtime import distributed as cdist

logger = logging.getLogger("vlbert.checkpoint")  # a child of the training logger (common.cli)

_STEP_FILE = re.compile(r"-(\d{4})-b(\d{7})\.model$")
_EPOCH_FILE = re.compile(r"-(\d{4})\.model$")


# --------------------------------------------------------------------------------------------- #
# Names
# --------------------------------------------------------------------------------------------- #
def epoch_checkpoint_path(prefix, epoch):
    """``{prefix}-{epoch:04d}.model``: the state after 0-based epoch ``epoch``."""
    return "{}-{:04d}.model".format(prefix, epoch)


def best_checkpoint_path(prefix):
    return "{}-best.model".format(prefix)


def step_checkpoint_path(prefix, epoch, epoch_batch):
    """Mid-epoch file: ``epoch_batch`` micro-batches of epoch ``epoch`` done."""
    return "{}-{:04d}-b{:07d}.model".format(prefix, epoch, epoch_batch)


def list_checkpoints(prefix):
    """Complete epoch and mid-epoch checkpoints of ``prefix``, oldest first.

    Returns:
        list of ``(position, path, is_step)``; ``position = (epoch, batches done)`` is where
        training continues: ``(e + 1, 0)`` after epoch file ``e``, ``(e, b)`` for a mid-epoch
        file. Temporary files of interrupted writes have other names and are never listed.
    """
    folder, base = os.path.split(os.path.abspath(prefix))
    if not os.path.isdir(folder):
        return []
    found = []
    for name in os.listdir(folder):
        if not name.startswith(base + "-"):
            continue
        rest = name[len(base):]
        step = _STEP_FILE.fullmatch(rest)
        epoch = _EPOCH_FILE.fullmatch(rest)
        if step:
            found.append(((int(step.group(1)), int(step.group(2))), os.path.join(folder, name), True))
        elif epoch:
            found.append(((int(epoch.group(1)) + 1, 0), os.path.join(folder, name), False))
    return sorted(found)


# --------------------------------------------------------------------------------------------- #
# Saving
# --------------------------------------------------------------------------------------------- #
def write_checkpoint_file(obj, path):
    """Write the checkpoint dict ``obj`` as the file ``path`` (``torch.save``) through the one atomic writer,
    :func:`common.fileio.safe_write.atomic_write`: never a torn file, ``open()``'s permissions; a stale
    ``.{name}.*.tmp`` of a killed write is removed by :func:`remove_stale_temp_files`.

    Raises:
        OutputWriteError: disk full, folder not writable, ... (names the folder and the cause).
    """
    aside = None
    if os.path.isdir(path):  # a sharded checkpoint folder of an FSDP run of that name: replaced by the file
        folder, base = os.path.split(os.path.abspath(path))
        aside = os.path.join(folder, ".{}.old.tmp".format(base))
        os.rename(path, aside)
    atomic_write(path, lambda f: torch.save(obj, f), size_hint=_tensor_bytes(obj))
    if aside is not None:
        shutil.rmtree(aside)


def _tensor_bytes(obj):
    """Bytes of the tensors in a nested dict / list (about the size of its checkpoint file)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _what_is_safe(path):
    """Which checkpoint a failed write of ``path`` left as the newest good one, as a sentence."""
    m = re.search(r"-(\d{4}(-b\d{7})?|best)\.model$", path)
    found = list_checkpoints(path[:m.start()]) if m else []
    if not found:
        return "no earlier checkpoint of this run exists"
    return ("the last good checkpoint, {}, is intact: free the space or fix the folder and run again, "
            "TRAIN.AUTO_RESUME continues from it".format(os.path.basename(found[-1][1])))


def remove_stale_temp_files(prefix):
    """Delete temporary files left by writes of ``prefix`` checkpoints that were killed."""
    folder, base = os.path.split(os.path.abspath(prefix))
    if not os.path.isdir(folder):
        return
    for name in os.listdir(folder):
        if name.startswith("." + base + "-") and (name.endswith(".tmp") or ".tmp." in name):
            path = os.path.join(folder, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def unwrap_model(model):
    """The module inside DistributedDataParallel / DataParallel wrappers (else ``model``)."""
    while isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    return model


def model_state_fp32(model):
    """The model's state dict without ``module.`` prefixes, floating tensors as fp32 CPU copies; of a model
    sharded by FSDP, the full tensors (a collective: every rank calls it)."""
    out = collections.OrderedDict()
    for k, v in gather_full(unwrap_model(model).state_dict()).items():
        v = v.detach()
        out[k] = (v.float() if v.is_floating_point() else v).cpu().clone()
    return out


def _config_text(config):
    if config is None or isinstance(config, str):
        return config
    from common.config import to_plain  # the config module is only needed when saving one
    return yaml.safe_dump(to_plain(config), default_flow_style=False, sort_keys=False)


def make_checkpoint(model, optimizer, validation_monitor=None, scaler=None, lr_scheduler=None,
                    train_state=None, config=None, rng=None, extra=None, gather=True):
    """The checkpoint dict (see the module docstring); only plain, ``weights_only``-safe values. The shards of
    an FSDP run (:mod:`common.parallel.fsdp`) are gathered into full tensors: every rank calls it then.

    Args:
        model: ``nn.Module`` (DDP-wrapped, FSDP-sharded or neither).
        optimizer: ``torch.optim.Optimizer``.
        validation_monitor, scaler, lr_scheduler: objects with ``state_dict()``, or dicts;
            None leaves the key out.
        train_state: the loop's progress dict (:mod:`common.checkpoint.train_state`), or None.
        config: CfgNode, dict or YAML text.
        rng: list of :func:`rng_state` per rank (default: this process's only).
        extra: dict key -> object with ``state_dict()`` (a stateful hook: ``ema``, ``early_stopping``).
        gather: False keeps the shards (DTensors) of an FSDP run as they are, for a sharded save.
    """
    full = gather_full if gather else (lambda value: value)
    model_state = model_state_fp32(model) if gather else unwrap_model(model).state_dict()
    ckpt = {"state_dict": model_state, "optimizer": full(optimizer.state_dict())}
    named = {"validation_monitor": validation_monitor, "amp": scaler, "lr_scheduler": lr_scheduler,
             "train_state": train_state, **(extra or {})}
    for key, obj in named.items():
        if obj is not None:
            ckpt[key] = obj if isinstance(obj, dict) else full(obj.state_dict())
    ckpt["rng"] = [rng_state()] if rng is None else rng
    if config is not None:
        ckpt["config"] = _config_text(config)
    return ckpt


def save_checkpoint(paths, model, optimizer, async_save=False, **kwargs):
    """Write :func:`make_checkpoint` atomically to ``paths`` (one path or a list) on rank 0; of a model sharded
    by FSDP, a sharded checkpoint folder under each path, each rank writing its shards
    (:mod:`common.checkpoint.sharded`; ``async_save``: in the background).

    Every rank must call it: the ranks' RNG states are gathered (a collective) so a resumed
    run continues each rank's random stream, and the shards of an FSDP model, optimizer and EMA
    are gathered. Other ranks return without writing.
    ``kwargs`` go to :func:`make_checkpoint`.

    Returns:
        None, or of a sharded save the :class:`common.checkpoint.sharded.PendingSave` to wait for.
    Raises:
        OutputWriteError: an OS failure (disk full, folder not writable, ...); the message names the
            folder, the cause and the last good checkpoint, which stays intact.
    """
    rng = cdist.all_gather(rng_state())
    if is_sharded(unwrap_model(model)):
        ckpt = make_checkpoint(model, optimizer, rng=rng, gather=False, **kwargs)
        return save_sharded_checkpoint(ckpt, paths, async_save=async_save, logger=logger)
    if not cdist.is_main_process():
        return None
    ckpt = make_checkpoint(model, optimizer, rng=rng, **kwargs)
    for path in [paths] if isinstance(paths, str) else paths:
        try:
            write_checkpoint_file(ckpt, path)
        except OutputWriteError as e:
            raise OutputWriteError("{}; {}".format(e, _what_is_safe(path))) from e
        logger.info("Saved checkpoint %s", path)


def prune_step_checkpoints(prefix, keep):
    """Delete mid-epoch checkpoints of ``prefix`` but the ``keep`` newest (rank 0 only)."""
    if not cdist.is_main_process():
        return
    steps = [path for _, path, is_step in list_checkpoints(prefix) if is_step]
    for path in steps[:max(len(steps) - keep, 0)]:
        shutil.rmtree(path) if is_sharded_checkpoint(path) else os.remove(path)


# --------------------------------------------------------------------------------------------- #
# Loading
# --------------------------------------------------------------------------------------------- #
def load_checkpoint_file(path):
    """Read a checkpoint dict on the CPU through :func:`common.fileio.safe_load.load_tensors` (nothing in it runs); a
    sharded checkpoint folder through :func:`common.checkpoint.sharded.read_sharded_checkpoint`, as one
    dict of full tensors (its DCP index read by :func:`common.fileio.safe_load.load_dcp_index`: nothing in it runs either).

    Raises:
        FileNotFoundError: no file at ``path``.
        CheckpointError: the file is unreadable, asks to run code, or is not a dict with ``state_dict``.
    """
    try:
        if is_sharded_checkpoint(path):
            ckpt = _read_folder(path)
        else:
            # MultiStepLR keeps its milestones in a Counter; allow that harmless container.
            ckpt = load_tensors(path, "checkpoint", allowed_globals=[collections.Counter])
    except UnreadableFileError as e:
        raise CheckpointError(str(e)) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        what = "keys {}".format(sorted(ckpt)[:10]) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError("{} is not a checkpoint: expected a dict with a 'state_dict' entry, found {}"
                              .format(path, what))
    return ckpt


def _read_folder(path):
    """:func:`common.checkpoint.sharded.read_sharded_checkpoint`; DCP's errors on a missing or torn shard
    become one CheckpointError naming the folder."""
    try:
        return read_sharded_checkpoint(path)
    except (CheckpointException, OSError, RuntimeError, KeyError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError("{} is not a readable sharded checkpoint: {}".format(path, reason)) from None


def match_key(key, targets):
    """``key``, or ``key`` with its ``module.`` prefix added or removed, whichever is in ``targets``."""
    if key in targets:
        return key
    other = key[len("module."):] if key.startswith("module.") else "module." + key
    return other if other in targets else None


def load_model_state_dict(model, state_dict, source="state dict"):
    """Load ``state_dict`` strictly into ``model``, whatever the ``module.`` prefixes on either side.

    Floating tensors are cast to the model's dtype (fp16 checkpoints of reference fp16 runs
    load into fp32 models). Into a model sharded by FSDP, each rank loads its shard of the full tensors.

    Raises:
        CheckpointError: missing / unexpected keys or shape mismatches, all listed, naming ``source``.
    """
    target = model.state_dict()
    keys = _fitting_keys(target, {k: v.shape for k, v in state_dict.items()}, source)
    parsed = {mk: state_dict[k] for mk, k in keys.items()}
    model.load_state_dict({k: shard_like(v.to(target[k].dtype) if v.is_floating_point() else v, target[k])
                           for k, v in parsed.items()})


def _fitting_keys(target, shapes, source):
    """``{key in target: key in shapes}`` when the checkpoint's tensor shapes ``shapes`` (``{key: shape}``) fit the
    state dict ``target`` key for key (``module.`` prefixes aside).

    Raises:
        CheckpointError: missing / unexpected keys or shape mismatches, all listed, naming ``source``.
    """
    parsed, unexpected = {}, []
    for k in shapes:
        mk = match_key(k, target)
        if mk is None:
            unexpected.append(k)
        else:
            parsed[mk] = k
    missing = [k for k in target if k not in parsed]
    mismatched = ["{}: {} in checkpoint, {} in model".format(mk, tuple(shapes[k]), tuple(target[mk].shape))
                  for mk, k in parsed.items() if tuple(shapes[k]) != tuple(target[mk].shape)]
    if missing or unexpected or mismatched:
        raise CheckpointError("{} does not fit the model:\n  missing keys: {}\n  unexpected keys: {}\n"
                              "  shape mismatches: {}".format(source, missing, unexpected, mismatched))
    return parsed


def _folder_index(path):
    """:func:`common.checkpoint.sharded.read_index` of the folder ``path``, its errors as one
    CheckpointError naming the file."""
    try:
        rest, index = read_index(path)
    except (UnreadableFileError, OSError) as e:
        raise CheckpointError(str(e)) from None
    if "state_dict" not in rest:
        raise CheckpointError("{} is not a checkpoint: expected a dict with a 'state_dict' entry, found keys {}"
                              .format(path, sorted(rest)[:10]))
    return rest, index


def read_into_shards(path, model, optimizer=None, extra=None, check=None):
    """The checkpoint dict of the folder ``path`` for restoring into the FSDP-sharded ``model`` (a collective:
    every rank calls it): each rank reads only its shards, straight into DTensors of this run's layout, resharded
    from the layout of the run that saved it whatever its number of ranks (``torch.distributed.checkpoint``).

    The model's and the ``extra`` objects' own tensors (``state_dict()``: the EMA copy) are filled in place; the
    optimizer's per-parameter tensors (Adam moments, of a parameter's shape) are new DTensors laid out as their
    parameter; every other tensor (RNG states, the loss scale, step counts) is read whole. No rank holds a full
    tensor of the model; nothing is written to disk. :func:`restore_checkpoint` then loads the dict as one read by
    :func:`load_checkpoint_file`.

    Args:
        check: ``check(ckpt, path)`` run before any tensor is read, on the dict with DCP slots for its tensors
            (its keys and ``config`` are the checkpoint's), or None.
    Raises:
        CheckpointError: the folder is unreadable, a shard is torn, or its model does not fit ``model``; what
            ``check`` raises.
    """
    rest, index = _folder_index(path)
    if check is not None:
        check(rest, path)
    logger.info("Reading %s: each rank its shards", path)
    own = unwrap_model(model).state_dict()
    saved = rest["state_dict"]
    keys = _fitting_keys(own, {k: index[slot_key(v)][0] for k, v in saved.items() if slot_key(v)}, path)
    live = {slot_key(saved[k]): own[mk] for mk, k in keys.items()}
    for name, obj in (extra or {}).items():
        if isinstance(rest.get(name), dict) and hasattr(obj, "state_dict"):
            state = obj.state_dict()
            live.update({slot_key(v): state[k] for k, v in rest[name].items()
                         if slot_key(v) and isinstance(state.get(k), torch.Tensor)})
    params = [p for group in optimizer.param_groups for p in group["params"]] if optimizer is not None else []
    like = {}
    for i, entry in rest.get("optimizer", {}).get("state", {}).items():
        if isinstance(i, int) and i < len(params) and isinstance(entry, dict):
            like.update({slot_key(v): params[i] for v in entry.values() if slot_key(v)})
    tensors = {}
    for key, (shape, dtype) in index.items():
        target = live.get(key)
        if target is not None and tuple(target.shape) == shape and target.dtype == dtype:
            tensors[key] = target  # read in place
        elif key in like and tuple(like[key].shape) == shape:
            tensors[key] = torch.empty_like(like[key], dtype=dtype)  # a DTensor: this rank's shard only
        else:
            tensors[key] = torch.empty(shape, dtype=dtype)
    try:
        return load_into(path, rest, tensors)
    except (CheckpointException, OSError, RuntimeError, KeyError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError("{} is not a readable sharded checkpoint: {}".format(path, reason)) from None


def _scaler_state(state):
    # An Apex amp.state_dict() holds one entry per loss scaler: {'loss_scaler0': {...}}.
    return state.get("loss_scaler0", state)


def restore_checkpoint(ckpt, model, optimizer=None, scaler=None, lr_scheduler=None,
                       validation_monitor=None, restore_rng=True, source="checkpoint", extra=None):
    """Load every part of ``ckpt`` present in it into the given objects.

    The model always loads; optimizer, loss scaler, LR scheduler, validation monitor and the ``extra``
    objects (dict key -> object with ``load_state_dict``) load when both the object and its key exist (reference checkpoints have no ``amp``,
    ``lr_scheduler``, ``rng`` or ``train_state``). With ``restore_rng``, this rank's RNG state
    is restored (rank 0's if the world size changed, which ends exactness).

    Returns:
        list of the keys that were restored.
    """
    load_model_state_dict(model, ckpt["state_dict"], source)
    restored = ["state_dict"]
    parts = {"optimizer": optimizer, "amp": scaler, "lr_scheduler": lr_scheduler,
             "validation_monitor": validation_monitor, **(extra or {})}
    for key, obj in parts.items():
        if obj is not None and key in ckpt:
            value = ckpt[key]
            if key == "amp":
                value = _scaler_state(value)
            elif key == "optimizer":
                value = shard_optimizer_state(obj, value)  # as is unless the model is sharded
            obj.load_state_dict(value)
            restored.append(key)
    if restore_rng and ckpt.get("rng"):
        states, rank = ckpt["rng"], cdist.get_rank()
        if len(states) != cdist.get_world_size():
            logger.warning("%s holds RNG states of %d ranks, this run has %d: using rank 0's (the rest of the "
                           "epoch still trains each sample once; random draws such as dropout differ from a run "
                           "on %d)", source, len(states), cdist.get_world_size(), len(states))
            rank = 0
        set_rng_state(states[rank])
        restored.append("rng")
    return restored


def find_resume_checkpoint(prefix, begin_epoch, end_epoch, resume=False, auto_resume=True):
    """Checkpoint paths to resume from, best first (empty: start from scratch).

    ``resume`` (TRAIN.RESUME): exactly ``{prefix}-{begin_epoch - 1:04d}.model``.
    ``auto_resume`` (TRAIN.AUTO_RESUME): every complete epoch or mid-epoch checkpoint whose
    epoch lies in ``[begin_epoch, end_epoch)``, newest position first (the reference searched
    the same epoch range).

    Raises:
        FileNotFoundError: ``resume`` and the file of epoch ``begin_epoch - 1`` is absent.
    """
    if resume:
        path = epoch_checkpoint_path(prefix, begin_epoch - 1)
        if not os.path.exists(path):  # a file, or the folder of a sharded checkpoint
            raise FileNotFoundError("TRAIN.RESUME with BEGIN_EPOCH={} needs {}, which does not exist"
                                    .format(begin_epoch, path))
        return [path]
    if not auto_resume:
        return []
    found = []
    for (epoch, batches), path, is_step in list_checkpoints(prefix):
        file_epoch = epoch if is_step else epoch - 1
        if begin_epoch <= file_epoch < end_epoch:
            found.append(path)
    return found[::-1]


@dataclass
class ResumeInfo:
    """What :func:`resume_training` restored: the file, the loop position, the keys loaded and the
    file's ``config`` YAML text (None when it has none)."""
    path: str
    state: dict
    restored: List[str]
    config: Optional[str] = None


def _train_state_of(ckpt, path, steps_per_epoch):
    if "train_state" in ckpt:
        return check_train_state(ckpt["train_state"])
    # A reference checkpoint: its name gives the epoch; steps counted as the reference did.
    m = _EPOCH_FILE.search(path)
    if m is None:
        raise CheckpointError("{} has no 'train_state' and its name gives no epoch".format(path))
    epoch = int(m.group(1)) + 1
    return new_train_state(epoch=epoch, global_step=int(epoch * steps_per_epoch) if steps_per_epoch else 0)


def _newest_readable(prefix, train_cfg, shards=False):
    """``(path, checkpoint, None)`` of the newest candidate that reads, ``(None, None, None)`` when there
    is no candidate, ``(None, None, message)`` when TRAIN.RESUME's file or every candidate is unreadable.
    With ``shards`` (the model is sharded), a folder is only checked (its ``rest.pt``, index and shard files), its
    checkpoint None: every rank then reads its shards (:func:`read_into_shards`)."""
    skipped = []
    for candidate in find_resume_checkpoint(prefix, train_cfg.BEGIN_EPOCH, train_cfg.END_EPOCH,
                                            train_cfg.RESUME, train_cfg.AUTO_RESUME):
        try:
            if shards and is_sharded_checkpoint(candidate):
                _folder_index(candidate)
                return candidate, None, None
            return candidate, load_checkpoint_file(candidate), None
        except CheckpointError as e:
            if train_cfg.RESUME:
                return None, None, str(e)
            logger.warning("skipping unreadable checkpoint, falling back to the previous one: %s", e)
            skipped.append(os.path.basename(candidate))
    if skipped:
        return None, None, (
            "none of the {} checkpoints of this run in {} can be read ({}); nothing was overwritten: restore "
            "a good copy, or move them away to train from scratch".format(
                len(skipped), os.path.dirname(os.path.abspath(prefix)), ", ".join(skipped)))
    return None, None, None


def resume_training(prefix, train_cfg, model, optimizer, scaler=None, lr_scheduler=None,
                    validation_monitor=None, steps_per_epoch=None, extra=None, check=None):
    """TRAIN.RESUME / TRAIN.AUTO_RESUME on every rank: restore the newest usable checkpoint.

    Rank 0 picks the file (the newest one that reads; with AUTO_RESUME a corrupt file is
    skipped with a warning, but when none reads the run stops rather than start over and
    overwrite them) and tells the others, so all ranks load the same one; every rank
    then restores model, optimizer, loss scaler, scheduler, validation monitor and its own RNG
    state. A sharded folder resumed by a sharded model is read shard by shard (:func:`read_into_shards`: no rank
    holds the whole model); a file, or a folder resumed without sharding, is read whole on every rank. Call it last before :func:`common.trainer.train`: anything drawing random numbers
    in between breaks exactness.

    Args:
        prefix: ``{output folder}/{MODEL_PREFIX}``.
        train_cfg: the ``TRAIN`` config node (RESUME, AUTO_RESUME, BEGIN_EPOCH, END_EPOCH).
        steps_per_epoch: optimizer steps per epoch (``len(loader) / GRAD_ACCUMULATE_STEPS``),
            used for ``global_step`` of a reference checkpoint, which does not store it.
        check: ``check(ckpt, path)`` run on the chosen checkpoint before anything is restored (the task's
            :meth:`common.task.Task.check_checkpoint`), or None.
    Returns:
        None when nothing was resumed, else :class:`ResumeInfo`; pass ``info.state`` as
        ``train(..., state=...)``, and rebuild the scheduler from the config at ``info.state['global_step']``
        (:func:`common.lr_scheduler.resume_lr_scheduler`).
    Raises:
        FileNotFoundError, CheckpointError: TRAIN.RESUME and the file is absent or unusable;
            AUTO_RESUME and every checkpoint is unreadable; a chosen checkpoint that does not fit
            the model (on every rank; the message names the run folder to move away); what ``check`` raises.
    """
    path, ckpt, error = None, None, None
    shards = is_sharded(unwrap_model(model))
    if cdist.is_main_process():
        remove_stale_temp_files(prefix)
        path, ckpt, error = _newest_readable(prefix, train_cfg, shards)
    path, error = cdist.broadcast_object((path, error))  # every rank stops on rank 0's error
    if error is not None:
        raise CheckpointError(error)
    if path is None:
        return None
    if shards and is_sharded_checkpoint(path):
        ckpt = read_into_shards(path, model, optimizer, extra, check)
    else:  # a file, or a folder read whole for an unsharded model
        if ckpt is None:
            ckpt = load_checkpoint_file(path)
        if check is not None:
            check(ckpt, path)
    try:
        restored = restore_checkpoint(ckpt, model, optimizer, scaler, lr_scheduler, validation_monitor, source=path,
                                      extra=extra)
    except CheckpointError as e:  # the run folder is another run's: say which folder, and what to give instead
        raise CheckpointError("{}\nThe run folder {} holds a run of another model (another config or data set): "
                              "move it away, or give this run its own folder (--model-dir, OUTPUT_PATH)".format(
                                  e, os.path.dirname(path))) from None
    state = _train_state_of(ckpt, path, steps_per_epoch)
    logger.info("Resumed from %s: epoch %d, batch %d, optimizer step %d", path, state["epoch"],
                state["epoch_batch"], state["global_step"])
    return ResumeInfo(path, state, restored, ckpt.get("config"))


class Checkpointer:
    """What a training checkpoint saves and restores, in one object (detectron2's ``Checkpointer`` role).

    It holds the model and every stateful object of a run under the key it takes in the file: the
    optimizer (``optimizer``), the loss scaler (``amp``), the LR scheduler (``lr_scheduler``) and the
    validation monitor's best epoch (``validation_monitor``, the one hook with a state); the loop's
    progress (``train_state``) is passed to :meth:`save`, where it is current. The file format is
    :func:`make_checkpoint`'s, the names :func:`epoch_checkpoint_path` and its siblings'.

    Args:
        model: the trained ``nn.Module`` (DDP-wrapped or not; saved without ``module.``).
        optimizer: its optimizer.
        prefix: ``{output folder}/{MODEL_PREFIX}``.
        config: saved under ``config`` (CfgNode, dict or YAML text), or None.
        scaler, lr_scheduler, validation_monitor: objects with ``state_dict()`` / ``load_state_dict()``,
            or None (left out of the file, not restored). A scheduler rebuilt after :meth:`resume`
            replaces ``lr_scheduler`` here.
        extra: dict file key -> further stateful object (a hook's: ``ema``, ``early_stopping``), saved and
            restored the same way.
        check: ``check(ckpt, path)`` run on a checkpoint before :meth:`resume` restores it (see
            :func:`resume_training`), or None.
        async_save: a sharded save (FSDP) writes in the background (TRAIN.ASYNC_CHECKPOINT); :meth:`wait`.
    """

    def __init__(self, model, optimizer, prefix, config=None, scaler=None, lr_scheduler=None,
                 validation_monitor=None, extra=None, check=None, async_save=False):
        self.model = model
        self.optimizer = optimizer
        self.prefix = prefix
        self.config = config
        self.scaler = scaler
        self.lr_scheduler = lr_scheduler
        self.validation_monitor = validation_monitor
        self.saved_at = None  # (epoch, epoch_batch) of the last save: a stop there need not save again
        self.extra = dict(extra or {})
        self.check = check
        self.async_save = async_save
        self.pending = None  # a sharded save still writing in the background

    def save(self, paths, train_state):
        """Write the checkpoint of the run at ``train_state`` to ``paths`` (see :func:`save_checkpoint`:
        every rank calls it, rank 0 writes).

        Raises:
            OutputWriteError: an OS failure; the last good checkpoint stays intact.
        """
        self.wait()
        self.pending = save_checkpoint(paths, self.model, self.optimizer, async_save=self.async_save,
                                       validation_monitor=self.validation_monitor, scaler=self.scaler,
                                       lr_scheduler=self.lr_scheduler, train_state=train_state, config=self.config,
                                       extra=self.extra)
        self.saved_at = (train_state["epoch"], train_state["epoch_batch"])

    def wait(self):
        """Wait until a background save (TRAIN.ASYNC_CHECKPOINT of a sharded run) is written and named."""
        if self.pending is not None:
            self.pending.wait()
            self.pending = None

    def resume(self, train_cfg, steps_per_epoch=None):
        """TRAIN.RESUME / TRAIN.AUTO_RESUME into the held objects; see :func:`resume_training`.

        Returns:
            None when nothing was resumed, else :class:`ResumeInfo`.
        """
        return resume_training(self.prefix, train_cfg, self.model, self.optimizer, self.scaler, self.lr_scheduler,
                               self.validation_monitor, steps_per_epoch=steps_per_epoch, extra=self.extra,
                               check=self.check)
