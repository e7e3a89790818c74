"""A memory-mapped cache of region features: decode the base64 files once, then read rows for free.

Decoding a per-image JSON (a ~1 MB base64 string per image) costs milliseconds per sample and its
result is not shared between DataLoader workers. The cache stores every image's rows in a few
flat binary arrays opened with ``numpy.memmap``: a sample is a slice, read from the page cache that
all workers and all ranks on a machine share, with no decoding, no pickling and no new dependency.

Layout of a cache folder (all arrays C-contiguous, little-endian)::

    index.npz       version, feature_dim, dtype (of the features); per image (M of them), in
                    write order: ids (str), offsets and num_boxes (int64, rows in boxes / features),
                    image_w, image_h (int64), image_box_row (int64, row in image_box.bin, -1: none)
    boxes.bin       float32 [R, 4]   R = total boxes; image i owns rows offsets[i] : offsets[i] + num_boxes[i]
    features.bin    dtype [R, D]     float32 (exact) or float16 (half the size)
    image_box.bin   dtype [K, D]     whole-image features of the K images that have one

A cache is written into a temporary folder next to its destination and renamed into place, so a
reader never sees a half-written cache.
"""
import os
import shutil

import numpy as np

from common.errors import UserInputError

from .region_features import RegionFeatures

__all__ = ["CACHE_VERSION", "FeatureCache", "FeatureCacheError", "write_feature_cache"]

CACHE_VERSION = 1
DTYPES = ("float32", "float16")
_INDEX = "index.npz"
_BOXES = "boxes.bin"
_FEATURES = "features.bin"
_IMAGE_BOX = "image_box.bin"


class FeatureCacheError(UserInputError):
    """A cache folder is incomplete or of another version, or lacks an image."""


def write_feature_cache(items, path, dtype="float32", overwrite=False):
    """Write RegionFeatures into a new cache folder at ``path``.

    Args:
        items: iterable of RegionFeatures (e.g. :func:`common.data.region_features.iter_tsv`);
            streamed, one image in memory at a time.
        path: the cache folder to create.
        dtype: ``'float32'`` or ``'float16'`` for features (boxes stay float32).
        overwrite: replace an existing cache at ``path`` instead of failing.
    Returns:
        dict ``images``, ``boxes``, ``feature_dim``, ``bytes`` of what was written.
    Raises:
        FeatureCacheError: ``path`` exists (without ``overwrite``), an image id repeats, or feature
            widths differ between images (names the id).
        ValueError: unknown ``dtype``.
    """
    if dtype not in DTYPES:
        raise ValueError("feature cache dtype must be one of {}, got {!r}".format(DTYPES, dtype))
    path = os.path.abspath(path)
    if os.path.exists(path) and not overwrite:
        raise FeatureCacheError("feature cache '{}' already exists; remove it or pass overwrite".format(path))
    tmp = "{}.partial-{}".format(path, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        index = _write_arrays(items, tmp, np.dtype(dtype))
        np.savez(os.path.join(tmp, _INDEX), version=CACHE_VERSION, dtype=dtype, **index)
        if os.path.exists(path):
            old = "{}.old-{}".format(path, os.getpid())
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    written = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
    return {"images": len(index["ids"]), "boxes": int(index["num_boxes"].sum()),
            "feature_dim": int(index["feature_dim"]), "bytes": written}


def _write_arrays(items, folder, dtype):
    ids, offsets, counts, widths, heights, image_box_rows = [], [], [], [], [], []
    seen, dim, rows, image_boxes = set(), None, 0, 0
    with open(os.path.join(folder, _BOXES), "wb") as fb, open(os.path.join(folder, _FEATURES), "wb") as ff, \
            open(os.path.join(folder, _IMAGE_BOX), "wb") as fi:
        for r in items:
            key = str(r.image_id)
            if key in seen:
                raise FeatureCacheError("image_id {} appears twice in the features to cache".format(key))
            seen.add(key)
            if r.num_boxes or r.image_box_feature is not None:  # an image without boxes may not know D
                width = r.features.shape[1] if r.num_boxes else r.image_box_feature.size
                dim = width if dim is None else dim
                if width != dim:
                    raise FeatureCacheError("image_id {}: features of width {}, earlier images have {}".format(
                        key, width, dim))
            fb.write(np.ascontiguousarray(r.boxes, dtype="<f4").tobytes())
            ff.write(np.ascontiguousarray(r.features, dtype=dtype.newbyteorder("<")).tobytes())
            if r.image_box_feature is not None:
                fi.write(np.ascontiguousarray(r.image_box_feature, dtype=dtype.newbyteorder("<")).tobytes())
            ids.append(key)
            offsets.append(rows)
            counts.append(r.num_boxes)
            widths.append(r.image_w)
            heights.append(r.image_h)
            image_box_rows.append(image_boxes if r.image_box_feature is not None else -1)
            image_boxes += r.image_box_feature is not None
            rows += r.num_boxes
    return {"ids": np.array(ids, dtype=str), "offsets": np.array(offsets, dtype=np.int64),
            "num_boxes": np.array(counts, dtype=np.int64), "image_w": np.array(widths, dtype=np.int64),
            "image_h": np.array(heights, dtype=np.int64), "image_box_row": np.array(image_box_rows, dtype=np.int64),
            "feature_dim": dim or 0}


class FeatureCache:
    """Read-only access to a cache folder written by :func:`write_feature_cache`.

    ``cache[image_id]`` (int or str id) returns RegionFeatures with float32 arrays (copies: callers
    may modify them). The memory maps are opened lazily in each process and are not pickled, so a
    cache can be handed to DataLoader workers.

    Raises:
        FileNotFoundError: no ``index.npz`` in ``path``.
        FeatureCacheError: another cache version, or a binary file whose size does not match the
            index (an interrupted copy); the message names the file.
    """

    def __init__(self, path):
        self.path = path
        index_path = os.path.join(path, _INDEX)
        if not os.path.isfile(index_path):
            raise FileNotFoundError("feature cache '{}' has no {} (build it with "
                                    "tools/build_feature_cache.py)".format(path, _INDEX))
        with np.load(index_path, allow_pickle=False) as index:
            index = {k: index[k] for k in index.files}
        if int(index["version"]) != CACHE_VERSION:
            raise FeatureCacheError("{}: cache version {}, this code reads version {}; rebuild it".format(
                index_path, int(index["version"]), CACHE_VERSION))
        self.dtype = np.dtype(str(index["dtype"])).newbyteorder("<")
        self.feature_dim = int(index["feature_dim"])
        self._ids = index["ids"]
        self._offsets, self._num_boxes = index["offsets"], index["num_boxes"]
        self._image_w, self._image_h, self._image_box_row = index["image_w"], index["image_h"], index["image_box_row"]
        self._rows = {image_id: i for i, image_id in enumerate(self._ids.tolist())}
        total = int(self._num_boxes.sum())
        self._shapes = {_BOXES: ((total, 4), np.dtype("<f4")), _FEATURES: ((total, self.feature_dim), self.dtype),
                        _IMAGE_BOX: ((int((self._image_box_row >= 0).sum()), self.feature_dim), self.dtype)}
        for name, (shape, dtype) in self._shapes.items():
            file = os.path.join(path, name)
            expected = int(np.prod(shape)) * dtype.itemsize
            if not os.path.isfile(file) or os.path.getsize(file) != expected:
                raise FeatureCacheError("{}: expected {} bytes ({} {}), found {}; rebuild the cache".format(
                    file, expected, "x".join(map(str, shape)), dtype.name,
                    os.path.getsize(file) if os.path.isfile(file) else "no file"))
        self._arrays = None

    def _open(self):
        if self._arrays is None:
            # mmap cannot map an empty file; an empty array reads the same.
            self._arrays = {name: np.memmap(os.path.join(self.path, name), dtype=dtype, mode="r", shape=shape)
                            if np.prod(shape) else np.zeros(shape, dtype)
                            for name, (shape, dtype) in self._shapes.items()}
        return self._arrays

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_arrays"] = None
        return state

    def __len__(self):
        return len(self._ids)

    def __contains__(self, image_id):
        return str(image_id) in self._rows

    @property
    def ids(self):
        """Image ids (strings) in write order."""
        return self._ids.tolist()

    def __getitem__(self, image_id):
        """RegionFeatures of one image (float32 ``boxes [N, 4]``, ``features [N, D]``,
        ``image_box_feature [D]`` or None).

        Raises:
            FeatureCacheError: the image is not in the cache (names the cache and the id).
        """
        i = self._rows.get(str(image_id))
        if i is None:
            raise FeatureCacheError("feature cache '{}' has no image_id {}".format(self.path, image_id))
        arrays = self._open()
        start, stop = int(self._offsets[i]), int(self._offsets[i] + self._num_boxes[i])
        row = int(self._image_box_row[i])
        image_box = arrays[_IMAGE_BOX][row].astype(np.float32) if row >= 0 else None
        return RegionFeatures(image_id=image_id, image_w=int(self._image_w[i]), image_h=int(self._image_h[i]),
                              boxes=np.array(arrays[_BOXES][start:stop], dtype=np.float32),
                              features=np.array(arrays[_FEATURES][start:stop], dtype=np.float32),
                              image_box_feature=image_box)
