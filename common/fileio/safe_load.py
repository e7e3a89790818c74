"""The one place where the product reads serialized files: nothing in a loaded file ever runs.

Every pickle-based file goes through here (a test fails on any ``torch.load`` / ``pickle.load``
elsewhere in the product):

* :func:`load_tensors` -- checkpoints, ResNet weights, BERT ``.bin``/``.safetensors``: torch's
  weights-only unpickler (``weights_only=True`` passed explicitly, which
  ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` cannot override) or the safetensors reader.
* :func:`load_pickle` -- plain pickles such as RefCOCO's ``refs(unc).p``: an unpickler that builds
  only containers, strings, numbers, booleans and None, and refuses every other global; with
  ``numpy_arrays=True`` also numpy arrays of numbers (CIFAR's "python version" batches).
* :func:`load_dcp_index` -- the index (``.metadata``) of a sharded checkpoint folder written by
  ``torch.distributed.checkpoint``: an unpickler that builds only DCP's metadata classes of tensors.

A refused or unreadable file raises :class:`UnreadableFileError`, whose one-line message names
the file and, for a refused file, the callable it asked for (which was not called).
"""
import contextlib
import os
import pickle
import re
import zipfile

import torch

from common.errors import UserInputError

# Globals a plain pickle may name: containers, numbers and bytes. Calling any of them with data from
# the file builds a value and runs nothing else.
_PLAIN_GLOBALS = {("builtins", name) for name in ("set", "frozenset", "bytearray", "complex")} | {
    ("collections", "OrderedDict"), ("_codecs", "encode")}
# What a pickled numpy array names (``ndarray.__reduce__``): an empty array, its dtype and the class; the
# array's bytes come through ``__setstate__``. Both numpy 1 and numpy 2 module paths appear in files.
_NUMPY_GLOBALS = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                  ("numpy", "ndarray"), ("numpy", "dtype")}
_GLOBAL_IN_MESSAGE = re.compile(r"GLOBAL ([\w.]+)")


class UnreadableFileError(UserInputError):
    """A file that cannot be read as what it should be, or that asks to run code (refused)."""


def _refused(path, what, name):
    return UnreadableFileError(
        "{} was refused ({}): it asks to call {}, and only tensors and plain values (containers, strings, "
        "numbers) are loaded; nothing from the file was run. Use files from a trusted source."
        .format(path, what, name))


def _reason(error):
    """torch's multi-paragraph weights-only message cut to the line that says what was wrong."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("Weights only load failed", "Check the documentation",
                                                             "Please file an issue"))]
    return (useful or lines or [type(error).__name__])[0]


@contextlib.contextmanager
def _allowed(globals_):
    """Let the weights-only unpickler build these extra (harmless) classes while inside."""
    serialization = torch.serialization
    if not globals_ or not hasattr(serialization, "safe_globals"):  # torch < 2.5 has no allowlist context
        yield
        return
    with serialization.safe_globals(list(globals_)):
        yield


def load_tensors(path, what="weights file", allowed_globals=()):
    """Read a torch file (zip or legacy format) or a ``.safetensors`` file on the CPU, safely.

    Args:
        path: file path.
        what: what the file is, for messages (e.g. ``"checkpoint"``, ``"NETWORK.IMAGE_PRETRAINED weights"``).
        allowed_globals: extra classes the file may hold (e.g. ``collections.Counter`` of an LR
            scheduler's state); tensors, dicts, lists, tuples, strings and numbers are always allowed.
    Returns:
        The stored object (tensors on the CPU). A ``.safetensors`` file, and a zip-format torch file read while the
        default device is ``meta``, are mapped into memory (``MAP_PRIVATE``): a page is read when first touched.
    Raises:
        FileNotFoundError: no file at ``path``.
        UnreadableFileError: truncated / not a torch file, or it names any other callable (refused,
            not called); the message names ``path``.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError("{} {} does not exist".format(what, path))
    try:
        if str(path).endswith(".safetensors"):
            from safetensors.torch import load_file  # a format without code: nothing to restrict
            return load_file(path, device="cpu")
        # On the meta device (a sharded start, common.parallel.meta_init) a zip-format file is mapped, not read:
        # each rank reads only the bytes of its shard groups, when they are filled (common.fileio.mapped).
        mmap = torch.get_default_device().type == "meta" and zipfile.is_zipfile(path)
        with _allowed(allowed_globals):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        refused = _GLOBAL_IN_MESSAGE.search(str(e))
        if refused:
            name = refused.group(1)  # torch names builtins without their module
            raise _refused(path, what, name if "." in name else "builtins." + name) from None
        name = _callable_in_plain_pickle(path)
        if name:
            raise _refused(path, what, name) from None
        raise UnreadableFileError("{} is not a readable {} ({})".format(path, what, _reason(e))) from None
    except Exception as e:  # truncated zip, wrong magic number, ...: all mean a bad file
        raise UnreadableFileError("{} is not a readable {} ({}: {})".format(
            path, what, type(e).__name__, _reason(e))) from None


class _Refused(pickle.UnpicklingError):
    """Something a plain pickle may not hold; its message is what was refused."""


class _RefusedGlobal(_Refused):
    """A global outside :data:`_PLAIN_GLOBALS`; its message is the refused ``module.name``."""


def _numeric_dtype(*args):
    """``numpy.dtype(*args)`` for a dtype without Python objects (an object array would unpickle objects
    through its state, outside what the file's globals say)."""
    import numpy as np

    dtype = np.dtype(*args)
    if dtype.hasobject:
        raise _RefusedGlobal("numpy.dtype({!r}) (an array of Python objects)".format(args[0]))
    return dtype


class _PlainUnpickler(pickle.Unpickler):
    """Unpickler that resolves only :data:`_PLAIN_GLOBALS` (and :data:`_NUMPY_GLOBALS` when
    ``numpy_arrays``); the refused name is kept for the message."""

    def __init__(self, file, numpy_arrays=False, **kwargs):
        super().__init__(file, **kwargs)
        self.numpy_arrays = numpy_arrays

    def find_class(self, module, name):
        module = "builtins" if module == "__builtin__" else module  # Python 2 pickles (and protocols < 3)
        if (module, name) in _PLAIN_GLOBALS:
            return super().find_class(module, name)
        if self.numpy_arrays and (module, name) in _NUMPY_GLOBALS:
            import numpy as np

            multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
            return {"_reconstruct": multiarray._reconstruct, "ndarray": np.ndarray, "dtype": _numeric_dtype}[name]
        raise _RefusedGlobal("{}.{}".format(module, name))

    def persistent_load(self, pid):
        raise _Refused("a persistent object ({!r})".format(pid))


def _callable_in_plain_pickle(path):
    """The first callable that a plain (not zip) pickle file names outside :data:`_PLAIN_GLOBALS`, or None.

    torch's weights-only unpickler stops at opcodes it lacks (protocol 4's FRAME: "Unsupported operand
    149") before it reaches the file's globals; :class:`_PlainUnpickler` reads every protocol and calls
    nothing it refuses. Only the first pickle is read: a legacy torch file starts with its magic number.
    """
    if zipfile.is_zipfile(path):
        return None
    try:
        with open(path, "rb") as f:
            _PlainUnpickler(f).load()
    except _RefusedGlobal as e:
        return str(e)
    except Exception:  # a persistent id, a truncated or foreign file: torch's reason stands
        return None
    return None


def load_pickle(path, what="pickle file", encoding="utf-8", numpy_arrays=False):
    """Read a plain Python pickle (any protocol, Python 2 ones too) holding only plain values.

    Args:
        path: file path.
        what: what the file is, for messages (e.g. ``"RefCOCO refs file"``).
        encoding: how Python 2 ``str`` objects are decoded (``"bytes"`` keeps them as bytes).
        numpy_arrays: also build numpy arrays whose dtype holds no Python objects (``numpy.ndarray``,
            ``numpy.dtype`` and numpy's ``_reconstruct``, what ``ndarray.__reduce__`` names).
    Returns:
        The stored value: dicts (also ``OrderedDict``), lists, tuples, sets, strings, bytes,
        numbers, booleans, None (and numpy arrays when ``numpy_arrays``).
    Raises:
        FileNotFoundError: no file at ``path``.
        UnreadableFileError: not a pickle, truncated, or it names any other callable (refused,
            not called); the message names ``path``.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError("{} {} does not exist".format(what, path))
    try:
        with open(path, "rb") as f:
            return _PlainUnpickler(f, numpy_arrays=numpy_arrays, encoding=encoding).load()
    except _Refused as e:
        raise _refused(path, what, e) from None
    except Exception as e:  # EOFError, UnpicklingError, UnicodeDecodeError, ...
        raise UnreadableFileError("{} is not a readable {} ({}: {})".format(
            path, what, type(e).__name__, e)) from None


# The classes of DCP's index (``torch.distributed.checkpoint``'s ``.metadata``) of a checkpoint of tensors: building
# one (a dataclass, an enum member, ``torch.Size``, a path, a layout looked up by name) runs nothing else.
# ``BytesStorageMetadata`` is left out on purpose: DCP reads such an entry with ``torch.load(weights_only=False)``.
_DCP_INDEX_GLOBALS = {("torch.distributed.checkpoint.metadata", name) for name in (
    "Metadata", "TensorStorageMetadata", "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING",
    "StorageMeta", "MetadataIndex")} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath")}


class _DcpIndexUnpickler(_PlainUnpickler):
    """Unpickler of DCP's index: :data:`_PLAIN_GLOBALS`, :data:`_DCP_INDEX_GLOBALS` and torch's dtypes
    (``torch.float32``, ...: objects named, not called)."""

    def find_class(self, module, name):
        if (module, name) in _DCP_INDEX_GLOBALS:
            return pickle.Unpickler.find_class(self, module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        return super().find_class(module, name)


def load_dcp_index(path, what="index of a sharded checkpoint"):
    """Read DCP's index file (``<folder>/.metadata`` of ``torch.distributed.checkpoint``) without running code:
    only DCP's metadata classes of a checkpoint of tensors are built, any other global is refused.

    Returns:
        ``torch.distributed.checkpoint.metadata.Metadata`` whose every entry is a ``TensorStorageMetadata``
        and whose shard files (``storage_data``) are plain file names in the folder, untransformed.
    Raises:
        FileNotFoundError: no file at ``path``.
        UnreadableFileError: truncated, not DCP's index, or it names another callable (refused, not called);
            the message names ``path``.
    """
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata

    if not os.path.isfile(path):
        raise FileNotFoundError("{} {} does not exist".format(what, path))
    try:
        with open(path, "rb") as f:
            index = _DcpIndexUnpickler(f).load()
    except _Refused as e:
        raise _refused(path, what, e) from None
    except Exception as e:  # EOFError, UnpicklingError, a class's own check, ...
        raise UnreadableFileError("{} is not a readable {} ({}: {})".format(path, what, type(e).__name__, e)) from None
    entries = getattr(index, "state_dict_metadata", None)
    storage = getattr(index, "storage_data", None)
    problem = None
    if not isinstance(index, Metadata) or not isinstance(entries, dict) or not isinstance(storage, dict):
        problem = "not DCP's Metadata of tensors"
    elif not all(isinstance(v, TensorStorageMetadata) for v in entries.values()):
        problem = "an entry that is not a tensor"
    elif not all(isinstance(k, MetadataIndex) and isinstance(v, _StorageInfo) and isinstance(v.relative_path, str)
                 and os.path.basename(v.relative_path) == v.relative_path not in ("", ".", "..")
                 and not v.transform_descriptors for k, v in storage.items()):
        problem = "a shard outside its folder or of an unknown encoding"
    if problem:
        raise UnreadableFileError("{} is not a readable {} ({})".format(path, what, problem))
    return index
