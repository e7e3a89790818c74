"""Detected candidate boxes for RefCOCO+ (``DATASET.*_BOXES: proposal``), from the two sources of the reference.

- ``official`` (``DATASET.PROPOSAL_SOURCE``): the MAttNet detections (Yu et al., CVPR 2018) that the
  field evaluates "detected regions" with, ``refcoco+/proposal/res101_coco_minus_refer_notime_dets.json``:
  a JSON list of ``{"det_id", "image_id", "box": [x, y, w, h], "category_id", "category_name", "score"}``
  (Mask R-CNN trained on COCO minus the RefCOCO images). Only ``image_id`` and ``box`` are used.
- ``vg``: the bottom-up-attention boxes (Visual Genome Faster R-CNN) precomputed for VQA, one JSON per image
  ``{image_id}.json`` with ``num_boxes`` and ``boxes`` (base64 of float32 ``x1, y1, x2, y2`` rows), in
  ``vgbua_res101_precomputed/trainval2014_resnet101_faster_rcnn_genome.zip`` (archive holding the folder of
  the same name) or that folder unpacked.
"""
import base64
import binascii
import json
import os

import numpy as np
import torch

from common.data.loading import load_json
from common.data.storage import container_exists, stored_folder

from .refer import RefCOCODataError, xywh_to_xyxy

MATTNET_DETECTIONS = os.path.join("refcoco+", "proposal", "res101_coco_minus_refer_notime_dets.json")
VG_BOXES_FOLDER = os.path.join("vgbua_res101_precomputed", "trainval2014_resnet101_faster_rcnn_genome")


def load_mattnet_detections(path):
    """Boxes of every image of the MAttNet detections file.

    Args:
        path: the detections JSON.
    Returns:
        dict image_id -> ``[K, 4]`` float32 ``x1, y1, x2, y2`` (``x2 = x + w``), detections in file order.
    Raises:
        FileNotFoundError: no such file.
        RefCOCODataError: not a list of detections with ``image_id`` and a 4-number ``box`` (names the entry).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError("MAttNet detections file '{}' not found (DATASET.*_BOXES 'proposal' with "
                                "PROPOSAL_SOURCE 'official'); see data/PREPARE_DATA.md".format(path))
    with open(path, encoding="utf-8") as f:
        try:
            detections = json.load(f)
        except json.JSONDecodeError as e:
            raise RefCOCODataError("invalid JSON in '{}': {}".format(path, e)) from None
    if not isinstance(detections, list):
        raise RefCOCODataError("{}: expected a JSON list of detections, got {}".format(
            path, type(detections).__name__))
    per_image = {}
    for i, det in enumerate(detections):
        box = det.get("box") if isinstance(det, dict) else None
        if not (isinstance(box, list) and len(box) == 4 and "image_id" in det):
            raise RefCOCODataError("{} (detection {}): expected {{'image_id': ..., 'box': [x, y, w, h]}}, got "
                                   "{!r}".format(path, i, det))
        per_image.setdefault(det["image_id"], []).append(box)
    return {image_id: xywh_to_xyxy(boxes) for image_id, boxes in per_image.items()}


class VGBoxes:
    """Reader of the VQA precomputed boxes, one image at a time.

    Args:
        data_path: ``DATASET.DATASET_PATH``; the boxes are read from the LMDB store
            ``{VG_BOXES_FOLDER}.lmdb@/{folder name}/`` when it exists, else from the archive
            ``{VG_BOXES_FOLDER}.zip@/{folder name}/`` when that exists, else from the folder.
    """

    def __init__(self, data_path):
        folder = os.path.join(data_path, VG_BOXES_FOLDER)
        self.root = next((stored for stored in (stored_folder(folder, s) for s in ("lmdb", "zip"))
                          if container_exists(stored)), folder)

    def path(self, image_id):
        """File holding the boxes of ``image_id``."""
        return os.path.join(self.root, "{}.json".format(image_id))

    def __call__(self, image_id):
        """``[K, 4]`` float32 ``x1, y1, x2, y2`` of the image's boxes.

        Raises:
            FileNotFoundError: no file for the image; RefCOCODataError: missing field or bad base64 / size.
        """
        path = self.path(image_id)
        data = load_json(path)
        try:
            num_boxes = int(data["num_boxes"])
            values = np.frombuffer(base64.b64decode(data["boxes"]), dtype=np.float32)
            boxes = values.reshape(num_boxes, -1) if num_boxes else values.reshape(0, 4)
        except (KeyError, TypeError, ValueError, binascii.Error) as e:
            raise RefCOCODataError("{}: expected 'num_boxes' and base64 float32 'boxes' ({}: {})".format(
                path, type(e).__name__, e)) from None
        if boxes.shape[1] < 4:
            raise RefCOCODataError("{}: boxes have {} columns, expected x1, y1, x2, y2".format(path, boxes.shape[1]))
        return torch.from_numpy(boxes[:, :4].copy())
