"""Read files packed into an LMDB store, addressed as ``store.lmdb@/inner/path``.

A store is the LMDB directory written by ``tools/pack_lmdb.py``: the named database ``files`` maps each
file's relative path (UTF-8 key, ``/`` separators) to its bytes as they were on disk (encoded JPEG / PNG,
JSON text); the named database ``meta`` holds ``complete`` (a JSON summary) once packing has finished.
The names inside are those a zip of the same files holds, so ``x.lmdb@/inner`` reads what ``x.zip@/inner``
reads (see ``common.data.storage``). Source of the environment rules: the py-lmdb documentation
(https://lmdb.readthedocs.io, "Environment class": an environment must not be used after ``fork()``).
"""
import os

import lmdb

from common.errors import UserInputError

LMDB_MARK = ".lmdb@"
# Named databases of a store: the files and the packing record.
FILES_DB = b"files"
META_DB = b"meta"
# Key in META_DB written when packing has finished (value: JSON {"items": int, "bytes": int}).
COMPLETE_KEY = b"complete"
MAX_DBS = 2


def is_lmdb_path(path):
    """True when ``path`` points inside an LMDB store (contains ``.lmdb@``)."""
    return LMDB_MARK in path


def split_lmdb_path(path):
    """Split ``"a/b.lmdb@/c/d.jpg"`` into ``("a/b.lmdb", "c/d.jpg")``.

    Raises:
        ValueError: ``path`` has no ``.lmdb@`` marker.
    """
    pos = path.find(LMDB_MARK)
    if pos < 0:
        raise ValueError("'{}' is not an LMDB path: expected 'store.lmdb@/inner/path'".format(path))
    return path[:pos + len(".lmdb")], path[pos + len(LMDB_MARK):].strip("/")


class LmdbReader:
    """Per-process cache of read-only LMDB environments, opened lazily and closed before every ``fork()``.

    An LMDB environment must not cross ``fork()`` (and py-lmdb refuses to open a store a second time in a
    process that inherited an open one), so :meth:`close_all` runs in the parent before each fork
    (``os.register_at_fork``): a forked DataLoader worker starts with no environment and opens its own on
    first use, as a spawned or forkserver worker does; the parent reopens its own on its next read.
    Environments are opened ``readonly`` (a store is never written while read), ``lock=False`` (no lock
    file: many readers, read-only or network file systems) and ``readahead=False`` (random access by
    index; readahead would fill the page cache with the neighbours of each item).
    """

    _envs = {}  # store path -> (environment, 'files' database handle)

    @classmethod
    def _open(cls, store):
        opened = cls._envs.get(store)
        if opened is None:
            if not os.path.isdir(store):
                raise FileNotFoundError("LMDB store '{}' does not exist (pack it with tools/pack_lmdb.py)".format(
                    store))
            try:
                env = lmdb.open(store, readonly=True, lock=False, readahead=False, max_dbs=MAX_DBS)
            except lmdb.Error as e:
                raise UserInputError("'{}' is not an LMDB store: {}".format(store, e)) from None
            try:
                files, meta = env.open_db(FILES_DB, create=False), env.open_db(META_DB, create=False)
            except lmdb.Error:
                env.close()
                raise UserInputError("'{}' is not a store of tools/pack_lmdb.py (no 'files' database)".format(
                    store)) from None
            with env.begin(db=meta) as txn:
                complete = txn.get(COMPLETE_KEY) is not None
            if not complete:
                env.close()
                raise UserInputError("LMDB store '{}' is incomplete: packing stopped before the end; run "
                                     "tools/pack_lmdb.py again with the same arguments to finish it".format(store))
            opened = cls._envs[store] = (env, files)
        return opened

    @classmethod
    def read(cls, path):
        """Bytes of the file named by ``store.lmdb@/inner/path``.

        Raises:
            FileNotFoundError: the store, or the key inside it, does not exist.
            UserInputError: the folder is not a finished store of ``tools/pack_lmdb.py``.
        """
        store, inner = split_lmdb_path(path)
        env, files = cls._open(store)
        with env.begin(db=files, buffers=False) as txn:
            data = txn.get(inner.encode("utf-8"))
        if data is None:
            raise FileNotFoundError("'{}' is not inside LMDB store '{}'".format(inner, store))
        return data

    @classmethod
    def has(cls, path):
        """True when the key named by ``store.lmdb@/inner`` exists (False when the store does not)."""
        store, inner = split_lmdb_path(path)
        if not os.path.isdir(store):
            return False
        env, files = cls._open(store)
        with env.begin(db=files) as txn:
            return txn.get(inner.encode("utf-8")) is not None

    @classmethod
    def keys(cls, store, prefix=""):
        """Sorted keys (str) of ``store`` that start with ``prefix``."""
        env, files = cls._open(store)
        start = prefix.encode("utf-8")
        out = []
        with env.begin(db=files) as txn:
            cursor = txn.cursor()
            if cursor.set_range(start):
                for key in cursor.iternext(keys=True, values=False):
                    if not key.startswith(start):
                        break
                    out.append(key.decode("utf-8"))
        return out

    @classmethod
    def close_all(cls):
        """Close every environment this process opened (before a fork; tests that rewrite a store)."""
        while cls._envs:
            cls._envs.popitem()[1][0].close()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere workers are spawned, so nothing is inherited
    os.register_at_fork(before=LmdbReader.close_all)

