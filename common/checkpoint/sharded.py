"""Sharded checkpoints of FSDP runs: one folder per checkpoint, each rank writing its own shard with
``torch.distributed.checkpoint`` (DCP).

A checkpoint of ``TRAIN.STRATEGY: fsdp`` keeps the name of a checkpoint file (``{prefix}-0003.model``, see
:mod:`common.checkpoint.checkpointer`) but is a folder::

    {prefix}-0003.model/
        __0_0.distcp, __1_0.distcp, ...   the tensors, each rank's shard (DCP's FileSystemWriter)
        .metadata                         DCP's index of the shards
        rest.pt                           everything else (train state, RNG, LR schedule, loss scale, config, the
                                          optimizer's param groups), written by rank 0, read by the safe loader

Atomic as a file checkpoint: the ranks write into a hidden ``.{name}.<random>.tmp`` folder, renamed to the final
name only once every shard and the DCP index are complete, so a torn checkpoint never has a checkpoint's name.

Reading (:func:`read_sharded_checkpoint`) gives the dict of a file checkpoint with full tensors, whatever the
number of ranks that wrote it: every reader of checkpoints (resume under either strategy and any world size,
``val.py``, ``test.py``, the predictor, ``tools/export.py``) takes a folder as it takes a file.
"""
import collections
import os
import shutil
import tempfile
import threading
import uuid

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from common.fileio.safe_load import load_tensors
from common.runtime import distributed as cdist

REST_FILE = "rest.pt"
_SLOT = "__dcp_tensor__"  # marks where a tensor of the DCP part goes back into the rest's structure


def is_sharded_checkpoint(path):
    """Whether ``path`` is a sharded checkpoint folder (else a checkpoint file or nothing)."""
    return os.path.isdir(path)


def _split(value, path, tensors):
    """``value`` with each tensor replaced by a slot naming it; the tensors go to ``tensors`` by that name.
    A container without tensors is returned as it is (a Counter stays a Counter)."""
    if isinstance(value, torch.Tensor):
        key = "/".join(str(p) for p in path)
        tensors[key] = value
        return {_SLOT: key}
    if isinstance(value, dict):
        out = {k: _split(v, path + (k,), tensors) for k, v in value.items()}
        return value if all(out[k] is v for k, v in value.items()) else out
    if isinstance(value, (list, tuple)):
        out = [_split(v, path + (i,), tensors) for i, v in enumerate(value)]
        return value if all(a is b for a, b in zip(out, value)) else type(value)(out)
    return value


def _join(value, tensors):
    """Inverse of :func:`_split`."""
    if isinstance(value, dict):
        if set(value) == {_SLOT}:
            return tensors[value[_SLOT]]
        return {k: _join(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_join(v, tensors) for v in value)
    return value


def _temp_folder(path):
    """A new hidden folder next to ``path`` for writing it (rank 0 picks the name, every rank gets it)."""
    name = None
    if cdist.is_main_process():
        folder, base = os.path.split(os.path.abspath(path))
        name = os.path.join(folder, ".{}.{}.tmp".format(base, uuid.uuid4().hex[:8]))
        os.makedirs(name)
    return cdist.broadcast_object(name)


def _replace(temp, path):
    """Give the complete folder ``temp`` the name ``path``; an older checkpoint of that name (a folder, or the
    file of a DDP run) is moved aside first and removed after."""
    if not os.path.lexists(path):
        os.rename(temp, path)
        return
    old = temp + ".old"
    os.rename(path, old)
    os.rename(temp, path)
    shutil.rmtree(old) if os.path.isdir(old) else os.remove(old)


class PendingSave:
    """A save in progress. The folders get their names as soon as the background write ends (in the writer's
    thread), so a run killed later still finds it; :meth:`wait` returns once that is done and raises what the
    write or the naming raised."""

    def __init__(self, future, finish):
        self.future, self.finish, self.error = future, finish, None
        self.named = threading.Event()
        if future is None:
            self._name(None)
        else:
            future.add_done_callback(self._name)

    def _name(self, future):
        try:
            if future is not None:
                future.result()
            self.finish()
        except BaseException as e:  # raised again by wait(), on the training thread
            self.error = e
        finally:
            self.named.set()

    def wait(self):
        self.named.wait()
        if self.error is not None:
            error, self.error = self.error, None
            raise error


_ASYNC_GROUP = {}  # the default process group -> the gloo group of its background saves


def _async_group():
    """A gloo process group of its own for ``dcp.async_save`` (torchtitan's choice too): the save's collectives
    (gathering the plans and the written shards' index) run in the writer's thread while training's own
    collectives go on in the default group, where they would pair up with each other. Made once, by every rank
    at its first background save (a collective)."""
    if not torch.distributed.is_initialized():
        return None
    default = torch.distributed.distributed_c10d._get_default_group()
    if default not in _ASYNC_GROUP:
        _ASYNC_GROUP.clear()  # of an earlier process group of this process
        _ASYNC_GROUP[default] = torch.distributed.new_group(backend="gloo")
    return _ASYNC_GROUP[default]


def save_sharded_checkpoint(ckpt, paths, async_save=False, logger=None):
    """Write the checkpoint dict ``ckpt`` (tensors possibly DTensor shards) to the folder(s) ``paths`` on every
    rank: each rank writes its shards, rank 0 the rest; a second path is a copy of the first.

    Args:
        ckpt: :func:`common.checkpoint.checkpointer.make_checkpoint`'s dict before gathering (model, optimizer and EMA
        shards). paths: one path or a list.
        async_save: write the shards in a background thread (``dcp.async_save``): the call returns once the
            tensors are copied to host memory; the folders get their names when the writes end.
    Returns:
        :class:`PendingSave` (call ``wait()`` before the next save and before the process ends).
    """
    paths = [paths] if isinstance(paths, str) else list(paths)
    tensors = {}
    rest = _split(ckpt, (), tensors)
    temp = _temp_folder(paths[0])
    if cdist.is_main_process():
        torch.save(rest, os.path.join(temp, REST_FILE))

    def finish():
        if not cdist.is_main_process():
            return
        for path in paths[1:]:
            copy = temp + ".copy"
            shutil.copytree(temp, copy)
            _replace(copy, path)
        _replace(temp, paths[0])
        if logger is not None:
            for path in paths:
                logger.info("Saved checkpoint %s", path)

    if async_save:
        return PendingSave(dcp.async_save(tensors, checkpoint_id=temp, process_group=_async_group()), finish)
    dcp.save(tensors, checkpoint_id=temp)
    pending = PendingSave(None, finish)
    pending.wait()
    return pending


def read_sharded_checkpoint(path):
    """The checkpoint dict of the folder ``path`` with full tensors on the CPU (one process, no collective).

    Raises:
        common.fileio.safe_load.UnreadableFileError: ``rest.pt`` is missing, unreadable or asks to run code.
        FileNotFoundError, RuntimeError: DCP's own errors on missing or torn shards.
    """
    rest = load_tensors(os.path.join(path, REST_FILE), "checkpoint", allowed_globals=[collections.Counter])
    with tempfile.TemporaryDirectory() as folder:  # DCP's converter writes one torch file, read back safely
        single = os.path.join(folder, "full.pt")
        dcp_to_torch_save(path, single)
        tensors = load_tensors(single, "checkpoint")
    return _join(rest, tensors)
