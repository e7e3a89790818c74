"""Samples of webdataset / img2dataset tar shards, read by member offset, and a resumable epoch order over them.

**Format.** A shard is an uncompressed POSIX tar file; the members of one sample share a key, the member's
path up to the first dot of its file name (``00001234.jpg``, ``00001234.txt``, ``00001234.json`` form sample
``00001234``), as webdataset and img2dataset write them. Shards are named by a brace pattern relative to a
folder (``cc3m/{00000..00331}.tar``; ``::`` joins several patterns), expanded by webdataset's own
``expand_urls``.

**Design: offset index + global order, not a streaming reader.** webdataset reads shards as streams in
``IterableDataset`` workers; its maintainer states that it has no exact mid-epoch restart (webdataset issues
#177, #234, #271): a stream position lives in each (rank, worker) and in each shuffle buffer. Here an index
pass (standard-library ``tarfile``, tar headers only, member data skipped by seeking) records where every member's
bytes lie, so a sample is one ``seek`` + ``read`` per member, and the shards become a map-style data set:

- the epoch's order is a pure function of ``(seed, epoch, samples per shard)`` (:func:`epoch_order`: a seeded
  shard permutation, then a seeded shuffle buffer over the concatenated samples, webdataset's ``shuffle(n)``
  done ahead), identical on every rank;
- the engine's samplers deal that order out to ranks (padded by at most ``ranks - 1`` repeated samples so
  every rank runs the same number of steps, whatever shard is short), DataLoader workers load the batches the
  main process hands them, and a checkpoint's ``epoch`` + ``epoch_units`` (units of that global order) are the
  whole position: no per-worker state exists to lose, and a resume re-shards the rest over any number of ranks;
- reads stay near-sequential: consecutive positions come from one shard or the next (the buffer window).

The price: shards must be local or mounted files (no ``pipe:`` / ``http`` streams) and uncompressed (a gzip
stream has no member offsets). img2dataset writes uncompressed tar by default.

**Index cache.** The index of ``x.tar`` is kept in ``x.tar.idx.json`` next to it (written atomically; a
read-only folder just recomputes it each run) and used while the shard's size and mtime are unchanged.
"""
import json
import logging
import os
import re
import tarfile

import numpy as np
from webdataset.shardlists import expand_urls

from common.errors import UserInputError
from common.fileio import safe_write

logger = logging.getLogger(__name__)

__all__ = ["IMAGE_EXTS", "KINDS", "ShardError", "ShardIndex", "cached_index", "epoch_order", "expand_shards",
           "index_shard", "write_shards"]

# Member kinds of a sample, columns of ShardIndex.offset / .size; an image is the first of IMAGE_EXTS present.
KINDS = ("image", "txt", "json", "npy")
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
INDEX_SUFFIX = ".idx.json"
INDEX_VERSION = 1
# webdataset's key rule (tariterators.base_plus_ext): path up to the first dot of the file name, and the rest.
_KEY_EXT = re.compile(r"^((?:.*/|)[^./][^/]*?)\.([^/]*)$")
# A tag mixed into the order's seed, so the order's stream differs from other draws of the same (seed, epoch).
_ORDER_TAG = 0x5EED0DE5


class ShardError(UserInputError):
    """A shard pattern that names no file, or a file that is not an uncompressed tar; names the key or file."""


def expand_shards(pattern, root="", setting="shards"):
    """The shard files of a brace pattern.

    Args:
        pattern (str): ``'cc3m/{00000..00331}.tar'``, relative to ``root`` unless absolute; ``::`` joins patterns.
        root (str): folder of relative patterns (``DATASET.DATASET_PATH``).
        setting (str): the config key holding ``pattern``, named in errors.
    Returns:
        list of str paths, in pattern order.
    Raises:
        ShardError: an empty pattern, a URL or ``pipe:`` (not random-access), or files that do not exist
            (names the key, the count and the first missing one).
    """
    if not pattern:
        raise ShardError("{}: no shard pattern given (e.g. 'cc3m/{{00000..00331}}.tar')".format(setting))
    paths = [os.path.join(root, p) for p in expand_urls(pattern)]
    remote = [p for p in paths if re.match(r"^(pipe|https?|s3|gs|gcs|ais):", p)]
    if remote:
        raise ShardError("{}: '{}' is a stream; shards are read by member offset and must be local or mounted "
                         "files".format(setting, remote[0]))
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise ShardError("{}: {} of {} shard file(s) not found, the first: '{}'".format(
            setting, len(missing), len(paths), missing[0]))
    return paths


def index_shard(path):
    """Where the members of each sample of one shard lie.

    Args:
        path (str): an uncompressed tar file.
    Returns:
        list of ``(key, {ext: (offset, size)})`` in order of first appearance; ``offset`` and ``size`` are bytes
        of the member's data in the file, ``ext`` lower-case (``'jpg'``, ``'txt'``, ``'cls.txt'``).
    Raises:
        ShardError: not a tar file (names it; a compressed shard is named as such).
    Warns (log):
        members whose data runs past the end of a truncated file are left out, with their count.
    """
    size = os.path.getsize(path)
    samples, cut, seen = {}, 0, 0
    try:
        with tarfile.open(path, "r:") as tar:
            for info in tar:
                seen += 1
                match = _KEY_EXT.match(info.name)
                if not info.isfile() or match is None:
                    continue
                if info.offset_data + info.size > size:
                    cut += 1
                    continue
                key, ext = match.groups()
                samples.setdefault(key, {})[ext.lower()] = (info.offset_data, info.size)
    except tarfile.ReadError as e:
        if seen:  # a file cut short after whole members: keep those
            logger.warning("shard '%s' is truncated (%s): the members after its first %d left out", path, e, seen)
            return list(samples.items())
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        raise ShardError("shard '{}' is not {}tar file ({}){}".format(
            path, "an uncompressed " if gzipped else "a ", e,
            ": it is gzip-compressed, and members of a compressed stream cannot be read by offset; "
            "decompress it (gunzip)" if gzipped else "")) from None
    if cut:
        logger.warning("shard '%s' is truncated: %d member(s) past its end left out", path, cut)
    return list(samples.items())


def cached_index(path):
    """:func:`index_shard` through the ``.idx.json`` cache next to the shard (see the module docstring).

    The pass costs about 0.1 ms of CPU per member (``tarfile``'s header parsing); index a large set once
    beforehand, in parallel: ``tools/convert_cc_shards.py index``.
    """
    stat = os.stat(path)
    stamp = {"version": INDEX_VERSION, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    cache = path + INDEX_SUFFIX
    try:
        with open(cache) as f:
            saved = json.load(f)
        if isinstance(saved, dict) and all(saved.get(k) == v for k, v in stamp.items()):
            return [(key, {ext: tuple(where) for ext, where in members.items()}) for key, members in saved["samples"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # no cache, another shard's, or torn by hand: index again
    samples = index_shard(path)
    try:
        safe_write.atomic_write(cache, lambda f: json.dump(dict(stamp, samples=samples), f), binary=False)
    except safe_write.OutputWriteError as e:  # a read-only data folder: index again next run
        logger.debug("index of %s not cached: %s", path, e)
    return samples


class ShardIndex:
    """Every sample of a list of shards, by global index (shard after shard, in list order).

    Attributes:
        paths (list of str): the shard files.
        counts (int64 ndarray ``(S,)``): samples per shard; ``starts`` (``(S,)``) index of each shard's first.
        shard (int32 ndarray ``(N,)``): shard of each sample.
        keys (bytes ndarray ``(N,)``): sample keys.
        offset (int64 ndarray ``(N, len(KINDS))``), size (int32, same shape): bytes of each member kind in its
            shard, -1 when absent (about 50 bytes a sample in all: CC3M's 3.3 M samples hold some 170 MB).
        image_code (int8 ndarray ``(N,)``): the image member's extension, an index into :data:`IMAGE_EXTS`.
    """

    def __init__(self, paths, per_shard):
        self.paths = list(paths)
        self.counts = np.array([len(s) for s in per_shard], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        samples = [sample for shard in per_shard for sample in shard]
        self.shard = np.repeat(np.arange(len(self.paths), dtype=np.int32), self.counts)
        self.keys = np.array([key.encode("utf-8") for key, _ in samples], dtype=bytes)
        self.offset = np.full((len(samples), len(KINDS)), -1, dtype=np.int64)
        self.size = np.full((len(samples), len(KINDS)), -1, dtype=np.int32)
        self.image_code = np.zeros(len(samples), dtype=np.int8)
        for i, (_, members) in enumerate(samples):
            self.image_code[i] = next((c for c, e in enumerate(IMAGE_EXTS) if e in members), 0)
            for k, ext in enumerate((IMAGE_EXTS[self.image_code[i]],) + KINDS[1:]):
                if ext in members:
                    self.offset[i, k], self.size[i, k] = members[ext]

    @classmethod
    def build(cls, paths, cache=True):
        """Index ``paths`` (each through its ``.idx.json`` cache when ``cache``); see :func:`index_shard`.

        Raises:
            ShardError: a file that is not an uncompressed tar, or no sample in any shard.
        """
        per_shard = [cached_index(p) if cache else index_shard(p) for p in paths]
        index = cls(paths, per_shard)
        if not len(index):
            raise ShardError("no sample in the {} shard(s) from '{}'".format(len(paths), paths[0] if paths else ""))
        return index

    def __len__(self):
        return len(self.keys)

    def has(self, i, kind):
        """Whether sample ``i`` has a member of ``kind`` (one of :data:`KINDS`)."""
        return self.size[i, KINDS.index(kind)] >= 0

    def name(self, i, kind=None):
        """``'<shard>:<key>.<ext>'``, how messages name a member (``'<shard>:<key>'`` the sample: ``kind`` None)."""
        sample = "{}:{}".format(self.paths[self.shard[i]], self.keys[i].decode("utf-8"))
        if kind is None:
            return sample
        return "{}.{}".format(sample, self.image_ext(i) if kind == "image" else kind)

    def image_ext(self, i):
        """The extension of sample ``i``'s image member (``'jpg'``...)."""
        return IMAGE_EXTS[self.image_code[i]]

    def read(self, i, kind):
        """The bytes of sample ``i``'s member of ``kind``.

        Raises:
            FileNotFoundError: the sample has no such member (names it).
            OSError: the shard cannot be read, or ends before the member does.
        """
        k = KINDS.index(kind)
        if self.size[i, k] < 0:
            raise FileNotFoundError("no member {}".format(self.name(i, kind)))
        with open(self.paths[self.shard[i]], "rb") as f:
            f.seek(int(self.offset[i, k]))
            data = f.read(int(self.size[i, k]))
        if len(data) != self.size[i, k]:
            raise OSError("{}: {} of {} bytes read (the shard was cut short)".format(
                self.name(i, kind), len(data), self.size[i, k]))
        return data


def epoch_order(counts, seed, epoch, buffer=1000):
    """The training order of one epoch over shards of ``counts`` samples: a permutation of global indices.

    The shards are taken in a permutation drawn from ``(seed, epoch)``, their samples concatenated in file
    order and passed through a shuffle buffer of ``buffer`` samples (once full, each incoming sample takes
    the place of one drawn at random, which is emitted; the rest is emitted in random order at the end), as
    webdataset's ``shuffle(buffer)`` does on a stream. Every draw comes from one numpy generator seeded
    by ``(seed, epoch)``, so every rank and every resumed process computes the same order.

    Args:
        counts (sequence of int): samples per shard (shard ``s`` holds global indices ``starts[s] ...``).
        seed, epoch (int >= 0): the run's seed and the epoch.
        buffer (int >= 1): shuffle buffer in samples; 1 keeps each shard's file order.
    Returns:
        int64 ndarray ``(sum(counts),)``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    rng = np.random.default_rng([int(seed), int(epoch), _ORDER_TAG])
    stream = np.concatenate([np.arange(starts[s], starts[s] + counts[s]) for s in rng.permutation(len(counts))]
                            + [np.zeros(0, dtype=np.int64)])
    if buffer <= 1 or len(stream) <= 1:
        return stream
    slots = rng.integers(0, buffer, size=max(len(stream) - buffer, 0)).tolist()
    items = stream.tolist()
    held, out = items[:buffer], []
    for incoming, j in zip(items[buffer:], slots):
        out.append(held[j])
        held[j] = incoming
    out.extend(np.asarray(held)[rng.permutation(len(held))].tolist())
    return np.asarray(out, dtype=np.int64)


def write_shards(samples, pattern_prefix, per_shard=1000, mtime=0.0):
    """Write samples as tar shards ``{pattern_prefix}-{00000..}.tar`` with webdataset's ``TarWriter``.

    Args:
        samples (iterable of dict): ``{'__key__': str, ext: bytes, ...}``, keys without dots.
        pattern_prefix (str): path prefix of the shard files; its folder is created.
        per_shard (int >= 1): samples per shard (the last one may hold fewer).
        mtime (float): member time stamps (fixed: the same samples give the same bytes).
    Returns:
        the brace pattern naming every shard written (``'train-{00000..00003}.tar'``, base name only), or
        None when ``samples`` is empty.
    """
    from webdataset import TarWriter

    os.makedirs(os.path.dirname(os.path.abspath(pattern_prefix)), exist_ok=True)
    shard, writer, written = -1, None, 0
    try:
        for sample in samples:
            if written % per_shard == 0:
                if writer is not None:
                    writer.close()
                shard += 1
                writer = TarWriter("{}-{:05d}.tar".format(pattern_prefix, shard), encoder=False, mtime=mtime)
            writer.write(sample)
            written += 1
    finally:
        if writer is not None:
            writer.close()
    if shard < 0:
        return None
    return "{}-{{00000..{:05d}}}.tar".format(os.path.basename(pattern_prefix), shard)
