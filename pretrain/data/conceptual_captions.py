"""Conceptual Captions in the reference release's layout: the caption index and the detector files.

``{DATASET_PATH}/{IMAGE_SET}_frcnn.json`` (``train_frcnn.json``, ``val_frcnn.json``) holds one
JSON object per line::

    {"image": "train_image.zip@/00000000.jpg",
     "caption": ["a", "very", "typical", "bus", "station"],
     "frcnn": "train_frcnn.zip@/00000000.json"}

and each ``frcnn`` file is the bottom-up-attention detector's output for that image::

    {"image_id": 0, "image_w": 640, "image_h": 480, "num_boxes": 10,
     "boxes": <base64 float32 (num_boxes, 4)>, "classes": <base64 float32 (num_boxes, 1601)>,
     "features": <base64 float32 (num_boxes, 2048)>, "attrs": <base64 float32 (num_boxes, 401)>}

Field by field in ``data/PREPARE_DATA.md``. Paths are relative to ``DATASET_PATH``; with
``DATASET.ZIP_MODE`` off, ``train_image.zip@/x.jpg`` is read as ``train_image/x.jpg`` (and a
sharded archive name ``train_frcnn.3.zip@/`` as the folder ``train_frcnn/``), as the reference does;
with ``DATASET.LMDB_MODE`` as the key ``x.jpg`` of the store ``train_image.lmdb`` (``train_frcnn.lmdb``
holds the members of every ``train_frcnn.N.zip``).
"""
import base64
import binascii
import os
import re
from collections import namedtuple

import numpy as np
import torch

from common.data.lmdbreader import LMDB_MARK
from common.data.loading import load_json, read_json_lines
from common.errors import UserInputError

PREPARE_DOC = "data/PREPARE_DATA.md"
# Index file of an image set (DATASET.TRAIN_IMAGE_SET 'train' -> train_frcnn.json).
INDEX_FILE = "{}_frcnn.json"

_ZIP_IN_PATH = re.compile(r"(\.\d+)?\.zip@/*")


class CaptionDataError(UserInputError):
    """Bad Conceptual Captions data; the message names the file (and line) and the field."""


CaptionRecord = namedtuple("CaptionRecord", "image caption frcnn line")
CaptionRecord.__doc__ = """One line of the caption index: ``image`` and ``frcnn`` are paths ready to
read (joined to ``DATASET_PATH``, zip paths resolved), ``caption`` the list of caption tokens
(str), ``line`` the 1-based line number in the index file."""

Detections = namedtuple("Detections", "boxes cls_scores features width height")
Detections.__doc__ = """Decoded detector file, regions sorted by their highest class score, best
first: ``boxes`` float32 ``(N, 4)`` ``x1, y1, x2, y2`` in pixels of the original image;
``cls_scores`` float32 ``(N, C)`` class distribution (C = 1601, column 0 background), or None when
the file has none and none was asked for;
``features`` float32 ``(N, D)`` (D = 2048) or None when not asked for; ``width``, ``height``
(int) the image size the boxes refer to."""


def local_path(data_path, path, storage):
    """Where to read ``path`` of the index: joined to ``data_path``; an ``archive.zip@/inner`` (or sharded
    ``archive.N.zip@/inner``) path stays as written in 'zip' storage, becomes ``archive/inner`` in 'folder'
    storage and ``archive.lmdb@/inner`` in 'lmdb' storage (``common.data.storage.STORAGES``)."""
    if storage != "zip":
        path = _ZIP_IN_PATH.sub(LMDB_MARK + "/" if storage == "lmdb" else "/", path)
    return os.path.join(data_path, path)


def read_caption_index(ann_file, data_path, storage="folder"):
    """Records of a caption index file (JSON lines).

    Args:
        ann_file (str): path of the index (``{DATASET_PATH}/train_frcnn.json``).
        data_path (str): ``DATASET.DATASET_PATH``; ``image`` and ``frcnn`` are relative to it.
        storage (str): 'folder', 'zip' or 'lmdb' (``DATASET.ZIP_MODE``, ``LMDB_MODE``); see ``local_path``.
    Returns:
        list of ``CaptionRecord``, in file order (blank lines skipped).
    Raises:
        FileNotFoundError: no index file (names it and the document explaining the layout).
        CaptionDataError: a line that is not a JSON object, lacks ``image``, ``caption`` or
            ``frcnn``, or has a field of the wrong type (names file, line and field).
    """
    if not os.path.isfile(ann_file):
        raise FileNotFoundError("Conceptual Captions index '{}' not found (DATASET.DATASET_PATH / "
                                "{{IMAGE_SET}}_frcnn.json); see {}".format(ann_file, PREPARE_DOC))
    records = []
    for line_no, where, item in read_json_lines(ann_file, ("image", "caption", "frcnn"), CaptionDataError):
        for key in ("image", "frcnn"):
            if not isinstance(item[key], str) or not item[key]:
                raise CaptionDataError("{}: '{}' must be a path (non-empty string), got {!r}".format(
                    where, key, item[key]))
        caption = item["caption"]
        if not (isinstance(caption, list) and all(isinstance(t, str) for t in caption)):
            raise CaptionDataError("{}: 'caption' must be a list of token strings, got {!r}".format(where, caption))
        records.append(CaptionRecord(local_path(data_path, item["image"], storage), caption,
                                     local_path(data_path, item["frcnn"], storage), line_no))
    return records


def decode_floats(text, rows, where):
    """``rows`` rows of float32 from a base64 string (the raw C-order array bytes).

    Args:
        text (str): base64 text (line breaks allowed).
        rows (int): number of rows (``num_boxes``).
        where (str): file and field, for errors.
    Returns:
        float32 tensor ``(rows, size / rows)`` (a copy, writable).
    Raises:
        CaptionDataError: not base64, or a byte count that is not ``rows`` whole float32 rows.
    """
    if not isinstance(text, str):
        raise CaptionDataError("{}: expected a base64 string, got {}".format(where, type(text).__name__))
    try:
        data = base64.b64decode(text)
    except (binascii.Error, ValueError) as e:
        raise CaptionDataError("{}: not valid base64 ({})".format(where, e)) from None
    if len(data) % (4 * rows):
        raise CaptionDataError("{}: {} bytes are not {} rows of float32".format(where, len(data), rows))
    return torch.from_numpy(np.frombuffer(data, dtype=np.float32).reshape(rows, -1).copy())


def load_detections(path, with_features=False, with_classes=True):
    """Read a detector file (plain, ``archive.zip@/inner`` or ``store.lmdb@/inner``); see :func:`detections_from_json`.

    Raises:
        FileNotFoundError: the file is missing.
        CaptionDataError: invalid JSON, or as :func:`detections_from_json`.
    """
    return detections_from_json(load_json(path), "detector file '{}'".format(path), with_features,
                                with_classes=with_classes)


def detections_from_json(meta, where, with_features=False, features=None, with_classes=True):
    """Decode the detector's JSON object of one image.

    Args:
        meta (dict): the object (``num_boxes``, ``image_w``, ``image_h``, ``boxes``, ``classes``, ``features``).
        where (str): how errors name it (``"detector file 'x.json'"``).
        with_features (bool): also decode ``features`` (``NETWORK.IMAGE_FEAT_PRECOMPUTED``).
        features (tensor or None): float32 ``(num_boxes, D)`` features given apart (a shard's ``.npy``
            member), used instead of ``meta['features']``.
        with_classes (bool): ``classes`` must be there (``NETWORK.WITH_MVRC_LOSS``); otherwise a file
            without it (grid or given boxes, ``tools/extract_features.py``) keeps its own region order.
    Returns:
        ``Detections``, regions sorted by their highest class score, best first (stable for
        ties), as the reference orders them before keeping the first ``SEQ_LEN``; without ``classes``
        in file order, with ``cls_scores`` None.
    Raises:
        CaptionDataError: not an object, a missing field, ``num_boxes < 1``, a field that does not decode to
            ``num_boxes`` rows, boxes without 4 columns (names ``where`` and the field).
    """
    if not isinstance(meta, dict):
        raise CaptionDataError("{}: expected a JSON object, got {}".format(where, type(meta).__name__))
    needed = ["num_boxes", "image_w", "image_h", "boxes"] + (["classes"] if with_classes else [])
    needed += ["features"] if with_features and features is None else []
    missing = [k for k in needed if k not in meta]
    if missing:
        raise CaptionDataError("{}: missing field(s) {}{}".format(
            where, ", ".join(missing), " (the precomputed-feature configs need 'features')"
            if missing == ["features"] else " (masked-region classification, NETWORK.WITH_MVRC_LOSS, needs a "
            "detector's 'classes'; boxes from a grid or a file have none)" if missing == ["classes"] else ""))
    rows = meta["num_boxes"]
    if not isinstance(rows, int) or rows < 1:
        raise CaptionDataError("{}: 'num_boxes' must be an int >= 1, got {!r}".format(where, rows))

    def field(key):
        return decode_floats(meta[key], rows, "{} field '{}'".format(where, key))

    boxes = field("boxes")
    if boxes.shape[1] != 4:
        raise CaptionDataError("{}: 'boxes' has {} numbers per box, expected 4 (x1, y1, x2, y2)"
                               .format(where, boxes.shape[1]))
    if with_features and features is not None and len(features) != rows:
        raise CaptionDataError("{}: {} feature rows for {} boxes".format(where, len(features), rows))
    if "classes" in meta:
        scores = field("classes")
        order = torch.sort(scores.max(dim=1).values, descending=True, stable=True).indices
        scores = scores[order]
    else:
        scores, order = None, torch.arange(rows)
    if with_features:
        features = (field("features") if features is None else features)[order]
    return Detections(boxes[order], scores, features if with_features else None,
                      int(meta["image_w"]), int(meta["image_h"]))
