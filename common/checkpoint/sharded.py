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

Nothing in a folder runs code: ``rest.pt`` is read by the weights-only loader, DCP's index by
:func:`common.fileio.safe_load.load_dcp_index` (DCP's metadata classes only), the shards by DCP's weights-only reads.
:func:`read_sharded_checkpoint` gives the dict of a file checkpoint with full tensors in one process, whatever the
number of ranks that wrote it (``val.py``, ``test.py``, the predictor, ``tools/export.py``, resume under DDP);
:func:`read_index` then :func:`load_into` read each rank's shards straight into DTensors of any layout (resume
under FSDP, resharded to the world size at load).
"""
import collections
import os
import shutil
import threading
import uuid
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import StorageMeta

from common.fileio.safe_load import UnreadableFileError, load_dcp_index, load_tensors
from common.runtime import distributed as cdist

REST_FILE = "rest.pt"
INDEX_FILE = ".metadata"  # DCP's name
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


def slot_key(value):
    """The DCP key of a tensor's slot in ``rest.pt``'s structure (see :func:`read_index`), or None."""
    return value[_SLOT] if isinstance(value, dict) and set(value) == {_SLOT} else None


def _slots(value):
    """The DCP keys that :func:`_split` left in ``value``, in order."""
    if isinstance(value, dict):
        if set(value) == {_SLOT}:
            return [value[_SLOT]]
        return [key for v in value.values() for key in _slots(v)]
    if isinstance(value, (list, tuple)):
        return [key for v in value for key in _slots(v)]
    return []


class _SafeReader(FileSystemReader):
    """DCP's reader of a folder with its index read by :func:`common.fileio.safe_load.load_dcp_index` (DCP's own reader
    runs a full unpickler on it); the shards are read as DCP reads them, with the weights-only unpickler."""

    def read_metadata(self, *args, **kwargs):
        index = load_dcp_index(os.path.join(str(self.path), INDEX_FILE))
        if index.storage_meta is None:
            index.storage_meta = StorageMeta()
        index.storage_meta.load_id = self.load_id
        return index


def read_index(path):
    """What the folder ``path`` holds, without reading its tensors (every rank may call it; no collective).

    Returns:
        ``(rest, index)``: the dict of ``rest.pt``, each tensor replaced by a slot naming its DCP key, and
        ``{key: (global shape tuple, dtype)}`` of those keys.
    Raises:
        FileNotFoundError, common.fileio.safe_load.UnreadableFileError: ``rest.pt`` or the index is missing, unreadable or
            asks to run code; the index lacks a tensor; a shard file is missing or shorter than the index says
            (a torn copy). The message names the file.
    """
    rest = load_tensors(os.path.join(path, REST_FILE), "checkpoint", allowed_globals=[collections.Counter])
    index = load_dcp_index(os.path.join(path, INDEX_FILE))
    keys = _slots(rest)
    missing = [key for key in keys if key not in index.state_dict_metadata]
    if missing:
        raise UnreadableFileError("{} is not a readable sharded checkpoint: its index {} lacks {} of the tensors "
                                  "rest.pt names ({})".format(path, INDEX_FILE, len(missing), missing[0]))
    ends = {}
    for info in index.storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        shard = os.path.join(path, name)
        if not os.path.isfile(shard) or os.path.getsize(shard) < end:
            raise UnreadableFileError("{} is not a readable sharded checkpoint: its shard {} is {}".format(
                path, name, "missing" if not os.path.isfile(shard) else "shorter than its index says"))
    return rest, {key: (tuple(index.state_dict_metadata[key].size), index.state_dict_metadata[key].properties.dtype)
                  for key in keys}


def load_into(path, rest, tensors, collective=True):
    """Fill ``tensors`` (``{DCP key: tensor}``, every key of ``rest``'s slots) from the folder ``path`` in place
    and put them back into ``rest``'s structure. A DTensor gets its own shard of the saved tensor, whatever the
    layout and the number of ranks that saved it (DCP reshards); a plain tensor gets the whole saved tensor.

    Args:
        collective: every rank calls it with the same keys (DTensors: a collective of the default group); False:
            one process, no collective (plain tensors only).
    Returns:
        ``rest`` with each slot replaced by its tensor.
    Raises:
        torch.distributed.checkpoint.CheckpointException, OSError, RuntimeError: a shard that cannot be read.
    """
    with warnings.catch_warnings():  # DCP warns that a read without collectives is a single process's: it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(tensors, storage_reader=_SafeReader(path), no_dist=not collective)
    return _join(rest, tensors)


def read_sharded_checkpoint(path):
    """The checkpoint dict of the folder ``path`` with full tensors on the CPU (one process, no collective, no
    temporary file).

    Raises:
        FileNotFoundError, common.fileio.safe_load.UnreadableFileError: see :func:`read_index`.
        torch.distributed.checkpoint.CheckpointException, OSError, RuntimeError: DCP's own errors on a shard.
    """
    rest, index = read_index(path)
    return load_into(path, rest, {key: torch.empty(shape, dtype=dtype) for key, (shape, dtype) in index.items()},
                     collective=False)
