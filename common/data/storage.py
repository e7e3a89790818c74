"""One resolver for every data path: a plain file, a zip member or an LMDB key.

A data set names a file by one string. ``a/b.jpg`` is a file; ``a/x.zip@/inner/b.jpg`` the member
``inner/b.jpg`` of the archive ``a/x.zip`` (:mod:`common.data.zipreader`); ``a/x.lmdb@/inner/b.jpg`` the key
``inner/b.jpg`` of the store ``a/x.lmdb`` packed by ``tools/pack_lmdb.py`` (:mod:`common.data.lmdbreader`).
An LMDB store holds the names a zip of the same files holds, so a task switches between its three storages
by changing the marker alone (:func:`stored_folder`), and every loader (``common.data.loading``, the feature
readers, the task data sets) reads through :func:`read_bytes` and :func:`list_dir`.
"""
import os

from .lmdbreader import LMDB_MARK, LmdbReader, is_lmdb_path, split_lmdb_path
from .zipreader import ZIP_MARK, ZipReader, is_zip_path, split_zip_path

# Where a data set's images and per-image files live: a folder, '<folder>.zip' or '<folder>.lmdb'.
STORAGES = ("folder", "zip", "lmdb")
_MARKS = {"zip": ZIP_MARK, "lmdb": LMDB_MARK}


def storage_of(dataset_cfg):
    """The storage a ``DATASET`` config node selects: 'lmdb' (``LMDB_MODE``), 'zip' (``ZIP_MODE``, a key of the
    VL-BERT tasks only) or 'folder'. The config check refuses both modes at once
    (``common.modeling.vlbert_config.VLBERT_RULES``)."""
    return "lmdb" if dataset_cfg.LMDB_MODE else "zip" if dataset_cfg.get("ZIP_MODE", False) else "folder"


def stored_folder(folder, storage):
    """Where the files of ``folder`` are read from in ``storage``.

    ``data/vcr/vcr1images`` stays as it is for 'folder', becomes ``data/vcr/vcr1images.zip@/vcr1images`` for
    'zip' (the archive holds the folder, as ``zip -r`` writes it) and ``data/vcr/vcr1images.lmdb@/vcr1images``
    for 'lmdb' (the store of that zip or folder: ``tools/pack_lmdb.py``).

    Raises:
        ValueError: ``storage`` is not one of :data:`STORAGES`.
    """
    if storage not in STORAGES:
        raise ValueError("storage must be one of {}, got {!r}".format(STORAGES, storage))
    if storage == "folder":
        return folder
    folder = folder.rstrip("/")
    return "{}{}/{}".format(folder, _MARKS[storage], os.path.basename(folder))


def container(path):
    """The file system path holding ``path``: the archive or store of a marked path, else ``path`` itself."""
    if is_lmdb_path(path):
        return split_lmdb_path(path)[0]
    if is_zip_path(path):
        return split_zip_path(path)[0]
    return path


def container_exists(path):
    """True when the folder, file, archive or store holding ``path`` exists (members are not looked up:
    checking data paths before a run must not open every archive)."""
    return os.path.exists(container(path))


def read_bytes(path):
    """Bytes of a plain file, an ``archive.zip@/inner`` member or a ``store.lmdb@/inner`` key.

    Raises:
        FileNotFoundError: naming the missing file, archive, store, member or key.
        common.errors.UserInputError: an LMDB store that packing did not finish, or a folder that is no store.
    """
    if is_lmdb_path(path):
        return LmdbReader.read(path)
    if is_zip_path(path):
        return ZipReader.read(path)
    with open(path, "rb") as f:
        return f.read()


def list_dir(folder):
    """The entries one level below ``folder`` (a folder, ``archive.zip@/inner`` or ``store.lmdb@/inner``).

    Archives and stores hold files only: a sub-folder there is a name prefix, and one without files does
    not exist.

    Returns:
        ``(dirs, files)``: two sorted lists of names (str, no separators).
    Raises:
        FileNotFoundError: the folder, archive or store does not exist.
    """
    if is_lmdb_path(folder) or is_zip_path(folder):
        if is_lmdb_path(folder):
            store, inner = split_lmdb_path(folder)
            prefix = inner + "/" if inner else ""
            names = LmdbReader.keys(store, prefix)
        else:
            archive, inner = split_zip_path(folder)
            prefix = inner + "/" if inner else ""
            names = [n for n in ZipReader.namelist(archive) if n.startswith(prefix) and not n.endswith("/")]
        dirs, files = set(), set()
        for name in names:
            head, sep, _ = name[len(prefix):].partition("/")
            (dirs if sep else files).add(head)
        return sorted(dirs), sorted(files)
    if not os.path.isdir(folder):
        raise FileNotFoundError("folder '{}' does not exist".format(folder))
    entries = os.listdir(folder)
    return (sorted(e for e in entries if os.path.isdir(os.path.join(folder, e))),
            sorted(e for e in entries if not os.path.isdir(os.path.join(folder, e))))
