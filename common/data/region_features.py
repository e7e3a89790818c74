"""Precomputed region features (boxes + one feature vector per box) in the two formats on disk.

**One JSON per image** (the reference release's VQA / RefCOCO+ / Conceptual Captions files, made by
the bottom-up-attention ``generate_tsv_v2.py``; VQA names them ``<image_id>.json``, possibly inside
a zip: ``features.zip@/folder/<image_id>.json``)::

    {"image_id": 9, "image_w": 640, "image_h": 480, "num_boxes": N,
     "boxes": base64(float32 [N, 4]), "features": base64(float32 [N, D]),
     "image_box_feature": base64(float32 [D])    # optional: the whole image as one box
     "classes": base64(float32 [N, C])           # optional: a detector's class distribution per box
     ...}                                        # (pretraining reads it); others ("attrs") are ignored

**Bottom-up-attention TSV** (Anderson et al., CVPR 2018, ``generate_tsv.py``): one image per line,
tab-separated, no header, fields ``image_id image_w image_h num_boxes boxes features``, the arrays
base64 float32 as above. Lines are long (100 boxes x 2048 floats is ~1.1 MB of base64), so the csv
field size limit is raised.

Boxes are ``(x1, y1, x2, y2)`` in pixels of the original image; D is 2048 for the released
ResNet-101 features. Arrays are little-endian float32 (``numpy.float32`` bytes, as written by the
bottom-up-attention code).
"""
import base64
import binascii
import csv
import io
import json
import os
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from common.errors import UserInputError

from .loading import load_json
from .storage import container, list_dir, read_bytes

__all__ = ["TSV_FIELDNAMES", "FeatureFileError", "RegionFeatures", "decode_array", "encode_array",
           "feature_json_path", "image_id_from_name", "iter_feature_folder", "iter_tsv", "read_feature_json",
           "write_feature_json", "write_tsv"]

TSV_FIELDNAMES = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
# Largest csv field we accept (bytes of one base64 array); far above 100 boxes x 2048 floats.
_CSV_FIELD_LIMIT = 2 ** 31 - 1


class FeatureFileError(UserInputError):
    """A feature file is malformed; the message names the file and the image id."""


@dataclass
class RegionFeatures:
    """The regions of one image.

    Attributes:
        image_id: id as stored (int for COCO, a string elsewhere).
        image_w, image_h: original image size in pixels (ints).
        boxes: float32 ``[N, 4]`` ``(x1, y1, x2, y2)`` in pixels of the original image.
        features: float32 ``[N, D]``.
        image_box_feature: float32 ``[D]`` feature of the whole image, or None.
        classes: float32 ``[N, C]`` class distribution of each box (a detector's, column 0 background), or
            None; written to JSON files only (pretraining's MVRC targets read it there, the VQA and RefCOCO+
            readers ignore it).
    """
    image_id: Union[int, str]
    image_w: int
    image_h: int
    boxes: np.ndarray
    features: np.ndarray
    image_box_feature: Optional[np.ndarray] = None
    classes: Optional[np.ndarray] = None

    @property
    def num_boxes(self):
        return len(self.boxes)


def encode_array(array):
    """Base64 text of an array's float32 bytes (what the readers decode)."""
    return base64.b64encode(np.ascontiguousarray(array, dtype=np.float32).tobytes()).decode("ascii")


def decode_array(text, key, where):
    """Flat (writable) float32 array from base64 text; ``where`` (file and id) goes into errors.

    Raises:
        FeatureFileError: not base64, or a byte count that is not a multiple of 4.
    """
    try:
        raw = base64.b64decode(text)
    except (binascii.Error, TypeError, ValueError) as e:
        raise FeatureFileError("{}: '{}' is not base64 text: {}".format(where, key, e)) from None
    if len(raw) % 4:
        raise FeatureFileError("{}: '{}' holds {} bytes, not float32 values".format(where, key, len(raw)))
    return np.frombuffer(raw, dtype=np.float32).copy()  # writable, as torch.from_numpy wants


def _to_int(value, key, where):
    try:
        return int(value)
    except (TypeError, ValueError):
        raise FeatureFileError("{}: '{}' must be an integer, got {!r}".format(where, key, value)) from None


def _region_features(record, where, feature_dim):
    """RegionFeatures from a mapping with the TSV fields (+ optional image_box_feature)."""
    missing = [k for k in TSV_FIELDNAMES[1:] if record.get(k) is None]
    if missing:
        raise FeatureFileError("{}: missing {}".format(where, ", ".join(repr(k) for k in missing)))
    num_boxes = _to_int(record["num_boxes"], "num_boxes", where)
    boxes = decode_array(record["boxes"], "boxes", where)
    if num_boxes < 0 or boxes.size != 4 * num_boxes:
        raise FeatureFileError("{}: num_boxes is {} but 'boxes' holds {} values, not {} x 4".format(
            where, num_boxes, boxes.size, num_boxes))
    features = decode_array(record["features"], "features", where)
    image_box = record.get("image_box_feature")
    image_box = decode_array(image_box, "image_box_feature", where) if image_box is not None else None
    dim = feature_dim or (image_box.size if image_box is not None else None)
    if dim is None:
        dim = features.size // num_boxes if num_boxes else 0
    if features.size != num_boxes * dim or (num_boxes and dim == 0):
        raise FeatureFileError("{}: num_boxes is {} but 'features' holds {} values, not {} x {}".format(
            where, num_boxes, features.size, num_boxes, dim if dim else "D"))
    if image_box is not None and image_box.size != dim:
        raise FeatureFileError("{}: 'image_box_feature' holds {} values, the box features {}".format(
            where, image_box.size, dim))
    return RegionFeatures(image_id=record["image_id"], image_w=_to_int(record["image_w"], "image_w", where),
                          image_h=_to_int(record["image_h"], "image_h", where), boxes=boxes.reshape(num_boxes, 4),
                          features=features.reshape(num_boxes, dim), image_box_feature=image_box)


def read_feature_json(path, feature_dim=None):
    """Read one per-image JSON file (plain, ``archive.zip@/member`` or ``store.lmdb@/key``).

    Args:
        path: the file.
        feature_dim: expected D; None infers it (from ``image_box_feature`` if present, else from
            the size of ``features`` and ``num_boxes``).
    Returns:
        RegionFeatures; ``image_id`` from the file, or its name without ``.json`` when absent.
    Raises:
        FileNotFoundError: no such file.
        FeatureFileError: a missing key, bad base64, or arrays whose sizes disagree with ``num_boxes``
            (the message names the file and the image id).
    """
    record = load_json(path)
    if not isinstance(record, dict):
        raise FeatureFileError("{}: expected a JSON object, got {}".format(path, type(record).__name__))
    record = dict(record)
    record.setdefault("image_id", os.path.splitext(os.path.basename(path))[0])
    return _region_features(record, "{} (image_id {})".format(path, record["image_id"]), feature_dim)


def feature_json_dict(regions):
    """The JSON object of :func:`write_feature_json` (arrays as base64 float32)."""
    record = {"image_id": regions.image_id, "image_w": int(regions.image_w), "image_h": int(regions.image_h),
              "num_boxes": int(regions.num_boxes), "boxes": encode_array(regions.boxes),
              "features": encode_array(regions.features)}
    if regions.image_box_feature is not None:
        record["image_box_feature"] = encode_array(regions.image_box_feature)
    if regions.classes is not None:
        record["classes"] = encode_array(regions.classes)
    return record


def write_feature_json(path, regions):
    """Write ``regions`` as one per-image JSON file (the format of :func:`read_feature_json`)."""
    with open(path, "w") as f:
        json.dump(feature_json_dict(regions), f)


def feature_json_path(folder, image_id):
    """``<folder>/<image_id>.json``, the reference's VQA naming (folder may be ``a.zip@/inner``)."""
    return "{}/{}.json".format(folder.rstrip("/"), image_id)


def image_id_from_name(path):
    """The image_id of an image file that has no other id: its name without folder and extension, an int
    when all digits (``photos/cat.jpg`` -> ``'cat'``, ``000123.png`` -> ``123``), as bottom-up-attention
    named its outputs; :func:`feature_json_path` then gives ``<folder>/cat.json``."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return int(stem) if stem.isdigit() else stem


def iter_feature_folder(folder, feature_dim=None):
    """Yield RegionFeatures of every ``*.json`` in a folder (or ``archive.zip@/folder``,
    ``store.lmdb@/folder``), by file name.

    Raises:
        FileNotFoundError: the folder, archive or store does not exist.
        FeatureFileError: see :func:`read_feature_json`.
    """
    for name in list_dir(folder)[1]:
        if name.endswith(".json"):
            yield read_feature_json("{}/{}".format(folder.rstrip("/"), name), feature_dim)


def _tsv_lines(path):
    if container(path) != path:  # inside an archive or store
        return io.StringIO(read_bytes(path).decode("ascii"))
    if not os.path.isfile(path):
        raise FileNotFoundError("feature file '{}' does not exist".format(path))
    return open(path, "r", newline="")


def iter_tsv(path, feature_dim=None):
    """Yield RegionFeatures of each line of a bottom-up-attention TSV file (``image_id`` an int when
    it is all digits, a string otherwise).

    Raises:
        FileNotFoundError: no such file.
        FeatureFileError: a line with another number of fields, or as :func:`read_feature_json`; the
            message names the file, the line and the image id.
    """
    csv.field_size_limit(_CSV_FIELD_LIMIT)
    with _tsv_lines(path) as f:
        for line, row in enumerate(csv.reader(f, delimiter="\t"), 1):
            if len(row) != len(TSV_FIELDNAMES):
                raise FeatureFileError("{} line {}: expected {} tab-separated fields ({}), got {}".format(
                    path, line, len(TSV_FIELDNAMES), " ".join(TSV_FIELDNAMES), len(row)))
            record = dict(zip(TSV_FIELDNAMES, row))
            if record["image_id"].isdigit():
                record["image_id"] = int(record["image_id"])
            yield _region_features(record, "{} line {} (image_id {})".format(path, line, record["image_id"]),
                                   feature_dim)


def write_tsv(path, items):
    """Write RegionFeatures as a bottom-up-attention TSV file (``image_box_feature`` and ``classes`` are
    not part of the format and are dropped)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t")
        for r in items:
            writer.writerow([r.image_id, int(r.image_w), int(r.image_h), r.num_boxes, encode_array(r.boxes),
                             encode_array(r.features)])
