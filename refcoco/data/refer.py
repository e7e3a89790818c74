"""RefCOCO+ annotations in the layout of the REFER toolkit (Yu et al., ECCV 2016; github lichengunc/refer).

``{data_path}/refcoco+/`` holds

- ``refs(unc).p``: a Python pickle of a list of *refs*, one per referred object:
  ``ref_id``, ``ann_id`` (the object's COCO annotation), ``image_id``, ``category_id``, ``split``
  (``train``, ``val``, ``testA``, ``testB``) and ``sentences``, each with ``sent_id``, ``tokens``
  (lower-case words), ``raw`` and ``sent``. It is read with :func:`common.fileio.safe_load.load_pickle`,
  which builds plain data only: a file that asks to call anything is refused, and nothing in it runs.
- ``instances.json``: COCO-format ``images`` (``id``, ``width``, ``height``), ``annotations`` (``id``,
  ``image_id``, ``bbox`` = ``[x, y, w, h]`` pixels, ``category_id``) and ``categories``.

Boxes come out as ``x1, y1, x2, y2`` with ``x2 = x + w``, the conversion the reference release applies.
"""
import os
from collections import OrderedDict

import torch
from torchvision.ops import box_convert

from common.data.loading import load_json
from common.errors import UserInputError
from common.fileio.safe_load import load_pickle

PREPARE_DOC = "data/PREPARE_DATA.md"
REFS_FILE = "refs({}).p"
INSTANCES_FILE = "instances.json"
# Split names of ``*_IMAGE_SET``, joined with '+' for several: 'test' is testA and testB together.
SPLITS = ("train", "val", "testA", "testB", "test")

_REF_KEYS = ("ref_id", "ann_id", "image_id", "split", "sentences")
_SENTENCE_KEYS = ("sent_id", "tokens")


class RefCOCODataError(UserInputError):
    """Bad RefCOCO+ data; the message names the file (and the ref or entry) and what was expected."""


def xywh_to_xyxy(boxes):
    """COCO ``[x, y, w, h]`` rows -> ``[x1, y1, x2, y2]`` with ``x2 = x + w`` (the reference's conversion).

    Args:
        boxes: ``[K, 4]`` numbers (tensor or nested lists).
    Returns:
        ``[K, 4]`` float32 tensor (``[0, 4]`` for no boxes).
    """
    boxes = torch.as_tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    return box_convert(boxes, "xywh", "xyxy")


def split_matches(split, ref_split):
    """Whether a ref whose ``split`` field is ``ref_split`` belongs to the requested ``split``.

    The REFER toolkit's rule: ``train`` / ``val`` match exactly; ``testA`` / ``testB`` match every
    test split holding that letter (``testAB`` too); ``test`` matches every test split.
    """
    if split in ("testA", "testB"):
        return ref_split.startswith("test") and split[-1] in ref_split[4:]
    if split == "test":
        return ref_split.startswith("test")
    return ref_split == split


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Refer:
    """Refs, images and annotations of one REFER data set, indexed by id.

    Args:
        data_path: ``DATASET.DATASET_PATH``, the folder holding ``refcoco+/``.
        dataset: sub-folder name (``'refcoco+'``).
        split_by: the refs file variant, ``refs({split_by}).p`` (``'unc'`` for RefCOCO+).

    Attributes:
        refs: ``OrderedDict`` ref_id -> ref dict, in file order.
        images: image_id -> COCO image dict; ``annotations``: ann_id -> COCO annotation dict.
        image_annotations: image_id -> list of its annotations, in file order.

    Raises:
        FileNotFoundError: a file is missing (the message names it and points to the data guide).
        common.fileio.safe_load.UnreadableFileError: ``refs(unc).p`` is not a plain pickle (refused: it asks to
            call something, which is not called) or is truncated.
        RefCOCODataError: a field is missing or of the wrong type, or a ref names an annotation or
            image that ``instances.json`` lacks (the message names the file and the ref).
    """

    def __init__(self, data_path, dataset="refcoco+", split_by="unc"):
        folder = os.path.join(data_path, dataset)
        self.refs_file = os.path.join(folder, REFS_FILE.format(split_by))
        self.instances_file = os.path.join(folder, INSTANCES_FILE)
        for path in (self.refs_file, self.instances_file):
            if not os.path.isfile(path):
                raise FileNotFoundError("RefCOCO+ file '{}' not found (DATASET.DATASET_PATH); see {}".format(
                    path, PREPARE_DOC))
        self._index_instances(load_json(self.instances_file))
        self.refs = self._index_refs(load_pickle(self.refs_file, what="RefCOCO+ refs file"))

    # ------------------------------------------------------------------ loading
    def _fail(self, path, where, message):
        raise RefCOCODataError("{} ({}): {}".format(path, where, message))

    def _entries(self, instances, key, fields):
        path = self.instances_file
        if not isinstance(instances, dict) or not isinstance(instances.get(key), list):
            self._fail(path, key, "expected a COCO instances object with a '{}' list".format(key))
        for i, entry in enumerate(instances[key]):
            where = "{}[{}]".format(key, i)
            if not isinstance(entry, dict):
                self._fail(path, where, "expected an object, got {}".format(type(entry).__name__))
            missing = [f for f in fields if f not in entry]
            if missing:
                self._fail(path, where, "missing field(s) {}".format(", ".join(missing)))
            yield where, entry

    def _index_instances(self, instances):
        path = self.instances_file
        self.images = {}
        for where, image in self._entries(instances, "images", ("id", "width", "height")):
            if not (_is_number(image["width"]) and _is_number(image["height"])):
                self._fail(path, where, "width and height must be numbers")
            self.images[image["id"]] = image
        self.annotations = {}
        self.image_annotations = {}
        for where, ann in self._entries(instances, "annotations", ("id", "image_id", "bbox")):
            bbox = ann["bbox"]
            if not (isinstance(bbox, list) and len(bbox) == 4 and all(_is_number(v) for v in bbox)):
                self._fail(path, where, "bbox must be [x, y, w, h] numbers, got {!r}".format(bbox))
            if ann["image_id"] not in self.images:
                self._fail(path, where, "image_id {} is not among the file's images".format(ann["image_id"]))
            self.annotations[ann["id"]] = ann
            self.image_annotations.setdefault(ann["image_id"], []).append(ann)

    def _index_refs(self, refs):
        path = self.refs_file
        if not isinstance(refs, list):
            self._fail(path, "top level", "expected a list of refs, got {}".format(type(refs).__name__))
        index = OrderedDict()
        for i, ref in enumerate(refs):
            where = "ref {}".format(i)
            if not isinstance(ref, dict):
                self._fail(path, where, "expected a dict, got {}".format(type(ref).__name__))
            missing = [k for k in _REF_KEYS if k not in ref]
            if missing:
                self._fail(path, where, "missing key(s) {}".format(", ".join(missing)))
            where = "ref {}, ref_id {}".format(i, ref["ref_id"])
            if ref["ann_id"] not in self.annotations:
                self._fail(path, where, "ann_id {} is not in {}".format(ref["ann_id"], self.instances_file))
            if self.annotations[ref["ann_id"]]["image_id"] != ref["image_id"]:
                self._fail(path, where, "image_id {} differs from that of annotation {} in {}".format(
                    ref["image_id"], ref["ann_id"], self.instances_file))
            if not isinstance(ref["split"], str):
                self._fail(path, where, "split must be a string, got {!r}".format(ref["split"]))
            if not isinstance(ref["sentences"], list):
                self._fail(path, where, "sentences must be a list")
            for sentence in ref["sentences"]:
                if not isinstance(sentence, dict) or any(k not in sentence for k in _SENTENCE_KEYS):
                    self._fail(path, where, "each sentence needs {}".format(", ".join(_SENTENCE_KEYS)))
                tokens = sentence["tokens"]
                if not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
                    self._fail(path, where, "sent_id {}: tokens must be a list of strings".format(
                        sentence["sent_id"]))
            if ref["ref_id"] in index:
                self._fail(path, where, "ref_id is used twice")
            index[ref["ref_id"]] = ref
        return index

    # ------------------------------------------------------------------ queries
    def ref_ids(self, split):
        """Ids of the refs of ``split`` (one of :data:`SPLITS`), in file order.

        Raises:
            ValueError: unknown split name.
        """
        if split not in SPLITS:
            raise ValueError("unknown RefCOCO+ split '{}': expected one of {} (several joined with '+')".format(
                split, ", ".join(SPLITS)))
        return [ref_id for ref_id, ref in self.refs.items() if split_matches(split, ref["split"])]

    def referred_box(self, ref_id):
        """``[4]`` float32 ``x1, y1, x2, y2`` of the object that ref ``ref_id`` refers to."""
        return xywh_to_xyxy([self.annotations[self.refs[ref_id]["ann_id"]]["bbox"]])[0]

    def image_boxes(self, image_id):
        """``[K, 4]`` float32 ``x1, y1, x2, y2`` of every annotated object of the image, in file order
        (the ``gt`` candidates; ``[0, 4]`` when it has none)."""
        return xywh_to_xyxy([ann["bbox"] for ann in self.image_annotations.get(image_id, [])])
