"""Pack the images and per-image JSON files (metadata, detector or feature records) of any task into one LMDB store.

    python tools/pack_lmdb.py OUT.lmdb SOURCE [SOURCE ...] [--root DIR] [--ext .jpg .json ...]

A SOURCE is a folder or a ``.zip`` archive. The key of a file is the name a data set reads it by, the name
a zip of the same files holds: a zip's member names as they are; a folder's files by their path relative to
``--root`` (default: the folder's parent, so the folder's own name leads, as ``zip -r`` writes it)::

    tools/pack_lmdb.py data/vcr/vcr1images.lmdb data/vcr/vcr1images.zip      # keys vcr1images/<movie>/<img>.jpg
    tools/pack_lmdb.py data/vcr/vcr1images.lmdb data/vcr/vcr1images          # the same keys
    tools/pack_lmdb.py data/cc/train_image.lmdb data/cc/train_image --root data/cc/train_image   # 00000000.jpg

Values are the files' bytes as stored (encoded JPEG / PNG, JSON text), not decoded arrays. Datasets read the
store with ``DATASET.LMDB_MODE: true`` (``data/PREPARE_DATA.md``, "LMDB"; ``common.data.lmdbreader``).

Safe to run again: keys already in the store are skipped, files are added in transactions of
``--commit-every`` files (a crash loses at most the open one), and the store is marked complete only when a
run has gone through every file, so readers refuse a store whose packing stopped half-way. Run the same
command again to finish it. Prints a progress bar (stderr) and a summary: files added, already present and
skipped (with the reason), bytes added, items and bytes in the store.
"""
import argparse
import json
import os
import sys
import zipfile
from collections import Counter

import lmdb
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.data.lmdbreader import COMPLETE_KEY, FILES_DB, MAX_DBS, META_DB  # noqa: E402
from common.errors import UserInputError  # noqa: E402

# Images (encoded) and JSON records: what the tasks' data sets read per item.
DEFAULT_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff", ".webp", ".json")
# Running total of the value bytes, updated in each data transaction (so it survives a crash with them).
BYTES_KEY = b"bytes"
# Bytes of a transaction before it is committed, whatever --commit-every says (bounds the memory of one).
MAX_TXN_BYTES = 256 << 20


def parse_args(argv=None):
    parser = argparse.ArgumentParser("Pack images and per-image JSON files into one LMDB store")
    parser.add_argument("out", help="store to create or complete (a folder, by convention '<name>.lmdb')")
    parser.add_argument("sources", nargs="+", help="folders and/or .zip archives to pack")
    parser.add_argument("--root", help="keys of folder files are their paths relative to ROOT (default: each "
                                       "folder's parent)")
    parser.add_argument("--ext", nargs="+", default=list(DEFAULT_EXTENSIONS),
                        help="file name endings to pack (case-insensitive); other files are skipped and listed")
    parser.add_argument("--commit-every", type=int, default=1000, help="files per transaction")
    return parser.parse_args(argv)


class Entry:
    """One file to pack: its key (str), how to read its bytes (a file path, or an archive and member) and its
    size in bytes (uncompressed)."""

    def __init__(self, key, path, size, member=None):
        self.key, self.path, self.size, self.member = key, path, size, member

    def where(self):
        return "{}@/{}".format(self.path, self.member) if self.member else self.path

    def read(self, archives):
        """The file's bytes; ``archives`` caches open ``ZipFile`` objects by path (one open per archive)."""
        if self.member is None:
            with open(self.path, "rb") as f:
                return f.read()
        if self.path not in archives:
            archives[self.path] = zipfile.ZipFile(self.path)
        return archives[self.path].read(self.member)


def collect(sources, root, extensions):
    """The files of ``sources`` to pack, sorted by key, and the skipped ones.

    Returns:
        ``(entries, skipped)``: list of :class:`Entry`; list of ``(path, reason)``.
    Raises:
        UserInputError: a source that does not exist or is neither a folder nor a zip, a folder outside
            ``root``.
    """
    extensions = tuple(e.lower() for e in extensions)
    entries, skipped = [], []
    for source in sources:
        if os.path.isdir(source):
            base = os.path.abspath(root if root else os.path.dirname(os.path.abspath(source)))
            if os.path.relpath(os.path.abspath(source), base).startswith(".."):
                raise UserInputError("source folder '{}' is not inside --root '{}'".format(source, root))
            for folder, dirs, files in os.walk(source):
                dirs.sort()
                for name in sorted(files):
                    path = os.path.join(folder, name)
                    if not name.lower().endswith(extensions):
                        skipped.append((path, "not an image or JSON file (--ext)"))
                    else:
                        key = os.path.relpath(os.path.abspath(path), base).replace(os.sep, "/")
                        entries.append(Entry(key, path, os.path.getsize(path)))
        elif os.path.isfile(source) and zipfile.is_zipfile(source):
            with zipfile.ZipFile(source) as z:
                for info in z.infolist():
                    if info.is_dir():
                        continue
                    if not info.filename.lower().endswith(extensions):
                        skipped.append(("{}@/{}".format(source, info.filename), "not an image or JSON file (--ext)"))
                    else:
                        entries.append(Entry(info.filename, source, info.file_size, info.filename))
        elif os.path.exists(source):
            raise UserInputError("source '{}' is neither a folder nor a zip archive".format(source))
        else:
            raise UserInputError("source '{}' does not exist".format(source))
    entries.sort(key=lambda e: e.key)
    unique = []
    for entry in entries:
        if unique and unique[-1].key == entry.key:
            skipped.append((entry.where(), "same key '{}' as {}".format(entry.key, unique[-1].where())))
        else:
            unique.append(entry)
    return unique, skipped


def open_store(out, map_size):
    """The writable LMDB environment of ``out`` and its two databases.

    Raises:
        UserInputError: ``out`` is a file, or a non-empty folder that is not an LMDB store.
    """
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserInputError("output '{}' is a file; give a new folder name (e.g. images.lmdb)".format(out))
    if os.path.isdir(out) and os.listdir(out) and not os.path.isfile(os.path.join(out, "data.mdb")):
        raise UserInputError("output '{}' is a folder that is not an LMDB store; give a new name".format(out))
    try:
        env = lmdb.open(out, map_size=map_size, max_dbs=MAX_DBS, subdir=True)
        return env, env.open_db(FILES_DB), env.open_db(META_DB)
    except lmdb.Error as e:
        raise UserInputError("cannot open LMDB store '{}' for writing: {}".format(out, e)) from None


def _with_room(env, write):
    """``write(txn)`` in one write transaction, the map doubled and the transaction run again while it is full
    (an aborted transaction writes nothing); returns what ``write`` returns."""
    while True:
        try:
            with env.begin(write=True) as txn:
                return write(txn)
        except lmdb.MapFullError:
            env.set_mapsize(2 * env.info()["map_size"])


def _put_batch(txn, files, meta, batch, archives):
    """Put the entries of ``batch`` not yet in the store, in the write transaction ``txn``.

    Returns:
        ``(added, present, bytes added, skipped)``: skipped is a list of ``(path, reason)`` (unreadable files).
    """
    added = present = nbytes = 0
    skipped = []
    for entry in batch:
        key = entry.key.encode("utf-8")
        if txn.get(key, db=files) is not None:
            present += 1
            continue
        try:
            data = entry.read(archives)
        except (OSError, zipfile.BadZipFile) as e:
            skipped.append((entry.where(), "unreadable: {}".format(e)))
            continue
        txn.put(key, data, db=files)
        added, nbytes = added + 1, nbytes + len(data)
    total = int(txn.get(BYTES_KEY, b"0", db=meta)) + nbytes
    txn.put(BYTES_KEY, str(total).encode(), db=meta)
    return added, present, nbytes, skipped


def _mark_complete(txn, files, meta):
    """Write the completion marker; returns ``(items, bytes)`` of the store."""
    items, total = txn.stat(files)["entries"], int(txn.get(BYTES_KEY, b"0", db=meta))
    txn.put(COMPLETE_KEY, json.dumps({"items": items, "bytes": total}).encode(), db=meta)
    return items, total


def pack(out, sources, root=None, extensions=DEFAULT_EXTENSIONS, commit_every=1000, progress=True):
    """Pack ``sources`` into the store ``out`` (see the module docstring); returns the summary dict.

    Returns:
        dict: ``added``, ``present`` (already in the store), ``bytes_added``, ``items`` and ``bytes`` (the
        whole store), ``skipped`` (list of ``(path, reason)``).
    Raises:
        UserInputError: bad sources, ``--root`` or output (see :func:`collect`, :func:`open_store`), a key
            longer than LMDB allows, ``commit_every`` < 1.
    """
    if commit_every < 1:
        raise UserInputError("--commit-every must be >= 1, got {}".format(commit_every))
    entries, skipped = collect(sources, root, extensions)
    sizes = [e.size for e in entries]
    # Room for the store as it is plus the files twice over (page rounding, tree pages) and the copy-on-write
    # pages of a transaction; grown on MapFullError (_with_room).
    stored = os.path.join(out, "data.mdb")
    map_size = max(64 << 20, 2 * sum(sizes) + (os.path.getsize(stored) if os.path.isfile(stored) else 0) + (16 << 20))
    env, files, meta = open_store(out, map_size)
    archives = {}
    try:
        too_long = [e for e in entries if len(e.key.encode("utf-8")) > env.max_key_size()]
        if too_long:
            raise UserInputError("key '{}' is longer than LMDB's {} bytes; pack from a --root closer to the "
                                 "files".format(too_long[0].key, env.max_key_size()))
        _with_room(env, lambda txn: txn.delete(COMPLETE_KEY, db=meta))  # incomplete until this run has read every file
        added = present = nbytes = 0
        bar = tqdm(total=len(entries), unit="file", desc="pack " + os.path.basename(out.rstrip("/")),
                   disable=not progress)
        start = 0
        while start < len(entries):
            stop, batch_bytes = start, 0
            while stop < len(entries) and stop - start < commit_every and batch_bytes < MAX_TXN_BYTES:
                batch_bytes += sizes[stop]
                stop += 1
            counts = _with_room(env, lambda txn: _put_batch(txn, files, meta, entries[start:stop], archives))
            added, present, nbytes = added + counts[0], present + counts[1], nbytes + counts[2]
            skipped += counts[3]
            bar.update(stop - start)
            start = stop
        bar.close()
        items, total = _with_room(env, lambda txn: _mark_complete(txn, files, meta))
        env.sync()
    finally:
        env.close()
        for archive in archives.values():
            archive.close()
    return {"added": added, "present": present, "bytes_added": nbytes, "items": items, "bytes": total,
            "skipped": skipped}


def print_summary(out, summary, listed=20):
    """Print the summary of :func:`pack`: counts, sizes, skipped files per reason and the first ``listed``."""
    print("{}: {} items, {:.1f} MB; this run added {} files ({:.1f} MB), {} were already there, {} skipped".format(
        out, summary["items"], summary["bytes"] / 1e6, summary["added"], summary["bytes_added"] / 1e6,
        summary["present"], len(summary["skipped"])))
    if summary["added"] == 0 and summary["present"]:
        print("  nothing to add: every file is already in the store")
    reasons = Counter(reason.split(":")[0] for _, reason in summary["skipped"])
    for reason, count in sorted(reasons.items()):
        print("  skipped {}: {}".format(count, reason))
    for path, reason in summary["skipped"][:listed]:
        print("  skipped {}: {}".format(path, reason))
    if len(summary["skipped"]) > listed:
        print("  ... and {} more".format(len(summary["skipped"]) - listed))


def main(argv=None):
    """Pack as the command line says; a user mistake ends with its ``error:`` line and exit code 2 (as
    ``common.cli.run_main``, which is not used: it imports torch, which packing does not need)."""
    args = parse_args(argv)
    try:
        summary = pack(args.out, args.sources, args.root, args.ext, args.commit_every)
    except UserInputError as e:
        print("error: {}".format(e), file=sys.stderr)
        sys.exit(2)
    print_summary(args.out, summary)


if __name__ == "__main__":
    main()
