"""Image-caption items for attention maps: COCO captions (``coco_captions``, the reference release's
layout) or a user's folder of images with a captions file, each with its boxes from a box source.

COCO (``DATASET.DATASET_PATH``, image set ``S`` = ``DATASET.VAL_IMAGE_SET``; a set without a year, such as the
reference's ``val``, means ``val2017``, the reference's files; ``val2014`` reads the 2014 files)::

    annotations/captions_S.json     {"images": [{"id", "file_name", ...}], "annotations": [{"image_id", "caption"}]}
    annotations/instances_S.json    {"images": [...], "annotations": [{"image_id", "bbox": [x, y, w, h]}]}
                                    (read for the 'coco' box source only)
    S/<file_name>                   the images; with DATASET.ZIP_MODE: S.zip@/S/<file_name>

As the reference: images in id order; each image's first caption; with the 'coco' boxes only images with at
least one instance, boxes ``x1, y1, x1 + max(w - 1, 0), y1 + max(h - 1, 0)`` in the file's order.

A user's folder (``read_caption_list``): a JSON list ``[{"image": "photo.jpg", "caption": "a dog on a mat",
"image_id": "photo"}, ...]`` (``image`` relative to the folder, ``image_id`` optional: the file name's stem).

Box sources (``attach_boxes``): ``coco`` (the instance boxes above), ``grid`` (a rows x cols grid,
``common.data.box_sources.grid_boxes``), ``file`` (a boxes JSON as ``tools/extract_features.py --boxes``
reads: ``[{"image_id", "image", "boxes": [[x1, y1, x2, y2, ...], ...]}]``) or ``features`` (a folder of the
per-image ``<image_id>.json`` files ``tools/extract_features.py`` writes, detector boxes included; only the
boxes are read). Boxes are pixels of the image file; with ``DATASET.ADD_IMAGE_AS_A_BOX`` the whole image is
region 0.
"""
import os
import re
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch.utils.data import Dataset

from common.data.box_sources import grid_boxes, read_box_list
from common.data.loading import check_image_size, load_image, load_json
from common.data.region_features import feature_json_path, read_feature_json
from common.data.samplers import resolve_key
from common.data.tokenizer import build_tokenizer
from common.data.transforms import clip_boxes_
from common.errors import UserInputError

from .truncation import truncate_text_and_regions

BOX_SOURCES = ("coco", "grid", "file", "features")
_YEAR = re.compile(r"\d{4}$")


class UnreadableImageError(UserInputError):
    """An item's image is missing or does not decode; the message names it (the attention script skips it)."""


@dataclass
class CaptionItem:
    """One image and its caption.

    Attributes:
        image_id: COCO id (int) or the user's id (str); names the output files.
        image: path of the image file (plain or ``archive.zip@/inner``).
        caption: the caption text.
        boxes: float32 [N, 4] ``x1, y1, x2, y2`` pixels of the image file, or None for a grid made when the
            image is read (its size is needed).
        recorded_size: ``(width, height)`` the boxes' source gives for the image, or None.
    """
    image_id: Union[int, str]
    image: str
    caption: str
    boxes: Optional[torch.Tensor] = None
    recorded_size: Optional[tuple] = None


def coco_image_set(image_set):
    """The COCO file stem of an image set: ``val`` -> ``val2017`` (the reference's files), ``val2014`` as given."""
    return image_set if _YEAR.search(image_set) else image_set + "2017"


def _coco_json(path, what):
    if not os.path.isfile(path):
        raise UserInputError("COCO {} file '{}' not found (DATASET.DATASET_PATH/annotations/; see "
                             "data/PREPARE_DATA.md, 'COCO captions')".format(what, path))
    data = load_json(path)
    if not (isinstance(data, dict) and isinstance(data.get("images"), list)
            and isinstance(data.get("annotations"), list)):
        raise UserInputError("{}: expected a COCO {} JSON object with 'images' and 'annotations' lists".format(
            path, what))
    return data


def read_coco_captions(data_path, image_set, zip_mode=False, instance_boxes=True):
    """The items of a COCO captions split, as the reference's ``COCOCaptionsDataset`` reads it.

    Args:
        data_path (str): ``DATASET.DATASET_PATH``.
        image_set (str): ``DATASET.VAL_IMAGE_SET`` (see :func:`coco_image_set`).
        zip_mode (bool): images in ``S.zip@/S/`` instead of the folder ``S/``.
        instance_boxes (bool): read ``instances_S.json`` for the boxes (the 'coco' box source) and keep only
            images that have instances; else every captioned image, ``boxes`` None.
    Returns:
        list of :class:`CaptionItem` in image-id order.
    Raises:
        UserInputError: a missing or malformed annotation file, an annotation without ``image_id`` /
            ``caption`` / ``bbox`` (names the file and the annotation's position).
    """
    stem = coco_image_set(image_set)
    folder = os.path.join(data_path, "{0}.zip@/{0}".format(stem) if zip_mode else stem)
    captions_file = os.path.join(data_path, "annotations", "captions_{}.json".format(stem))
    captions = _coco_json(captions_file, "captions")
    first_caption = {}
    for i, ann in enumerate(captions["annotations"]):
        if not (isinstance(ann, dict) and "image_id" in ann and isinstance(ann.get("caption"), str)):
            raise UserInputError("{}: annotations[{}] needs 'image_id' and a 'caption' string".format(captions_file, i))
        first_caption.setdefault(ann["image_id"], ann["caption"])
    files = {img["id"]: img["file_name"] for img in captions["images"]}
    boxes = None
    if instance_boxes:
        instances_file = os.path.join(data_path, "annotations", "instances_{}.json".format(stem))
        boxes = {}
        for i, ann in enumerate(_coco_json(instances_file, "instances")["annotations"]):
            bbox = ann.get("bbox") if isinstance(ann, dict) else None
            if not (isinstance(bbox, list) and len(bbox) == 4 and "image_id" in ann):
                raise UserInputError("{}: annotations[{}] needs 'image_id' and 'bbox': [x, y, w, h]".format(
                    instances_file, i))
            x, y, w, h = (float(v) for v in bbox)
            boxes.setdefault(ann["image_id"], []).append([x, y, x + max(w - 1, 0.0), y + max(h - 1, 0.0)])
    items = []
    for image_id in sorted(files):
        if image_id not in first_caption or (boxes is not None and image_id not in boxes):
            continue
        items.append(CaptionItem(image_id, "{}/{}".format(folder, files[image_id]), first_caption[image_id],
                                 None if boxes is None else torch.tensor(boxes[image_id], dtype=torch.float32)))
    if not items:
        raise UserInputError("{}: no image with a caption{}".format(
            captions_file, " and instance boxes" if instance_boxes else ""))
    return items


def read_caption_list(images, captions_file):
    """Items of a user's folder: ``captions_file`` is a JSON list of ``{"image", "caption"[, "image_id"]}``.

    Raises:
        UserInputError: the file is missing or not such a list (names the file and the entry).
    """
    if not os.path.isfile(captions_file):
        raise UserInputError("captions file '{}' not found (--captions: a JSON list of {{\"image\": FILE, "
                             "\"caption\": TEXT}})".format(captions_file))
    entries = load_json(captions_file)
    if not isinstance(entries, list) or not entries:
        raise UserInputError("{}: expected a non-empty JSON list of {{\"image\": FILE, \"caption\": TEXT}}".format(
            captions_file))
    items = []
    for i, e in enumerate(entries):
        if not (isinstance(e, dict) and isinstance(e.get("image"), str) and isinstance(e.get("caption"), str)):
            raise UserInputError("{}: entry {} needs 'image' (a file under {}) and 'caption' (text)".format(
                captions_file, i, images))
        image_id = e.get("image_id", os.path.splitext(os.path.basename(e["image"]))[0])
        items.append(CaptionItem(image_id, os.path.join(images, e["image"]), e["caption"]))
    return items


def attach_boxes(items, source, box_file=None):
    """Give each item its boxes from ``source`` (one of :data:`BOX_SOURCES`).

    Args:
        items: :class:`CaptionItem` list; for 'coco' their boxes are already set.
        source: 'coco', 'grid' (boxes made per image by the dataset), 'file' or 'features'.
        box_file: the boxes JSON ('file') or the per-image JSON folder ('features').
    Returns:
        the items (changed in place).
    Raises:
        UserInputError: unknown source; 'coco' for items without instance boxes; no ``box_file``; an item
            whose ``image_id`` the box file or folder lacks (names the file and the id).
    """
    if source not in BOX_SOURCES:
        raise UserInputError("box source '{}': expected one of {}".format(source, ", ".join(BOX_SOURCES)))
    if source == "coco":
        if any(item.boxes is None for item in items):
            raise UserInputError("box source 'coco' needs the COCO instance boxes (the coco_captions data set)")
        return items
    if source == "grid":
        for item in items:
            item.boxes = None
        return items
    if not box_file:
        raise UserInputError("box source '{}' needs --box-file ({})".format(
            source, "a boxes JSON" if source == "file" else "a folder of <image_id>.json feature files"))
    if source == "file":
        by_id = {str(e["image_id"]): e["boxes"] for e in read_box_list(box_file)}
        for item in items:
            if str(item.image_id) not in by_id:
                raise UserInputError("{}: no entry with image_id {} (image {})".format(box_file, item.image_id,
                                                                                      item.image))
            item.boxes = by_id[str(item.image_id)]
        return items
    for item in items:
        path = feature_json_path(box_file, item.image_id)
        try:
            regions = read_feature_json(path)
        except FileNotFoundError:
            raise UserInputError("{}: no feature file for image_id {} (image {})".format(
                path, item.image_id, item.image)) from None
        item.boxes = torch.from_numpy(regions.boxes)
        item.recorded_size = (regions.image_w, regions.image_h)
    return items


class CaptionAttentionDataset(Dataset):
    """Items for attention maps: image, boxes and ``[CLS] caption [SEP]``, in ``data_names`` order.

    Args:
        items: :class:`CaptionItem` list.
        tokenizer: ``BertTokenizer``.
        seq_len (int): text tokens plus regions at most (``DATASET.SEQ_LEN``), cut by the pretraining rule
            (``truncation.truncate_text_and_regions``).
        add_image_as_a_box (bool): region 0 is the whole image (``DATASET.ADD_IMAGE_AS_A_BOX``).
        grid (tuple): ``(rows, cols)`` of the grid for items without boxes.
        transform: ``common.data.transforms`` pipeline (resize, normalise; no flip here).

    ``dataset[key]`` gives ``image`` float (3, H, W), ``boxes`` float (N, 4) pixels of the transformed image,
    ``im_info`` float (5,) ``width, height, scale_x, scale_y, index``, ``text`` int64 (Lt,);
    :meth:`load` gives that and what the output files record.

    Raises (on reading an item):
        UnreadableImageError: an image that is missing or does not decode (names it).
        UserInputError: detector boxes for another size of the image (``check_image_size``).
    """

    data_names = ["image", "boxes", "im_info", "text"]

    def __init__(self, items, tokenizer, seq_len=64, add_image_as_a_box=True, grid=(3, 3), transform=None):
        self.items = items
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.add_image_as_a_box = add_image_as_a_box
        self.grid = grid
        self.transform = transform

    @classmethod
    def from_config(cls, cfg, mode, transform=None):
        """The COCO split ``DATASET.{MODE}_IMAGE_SET`` with its instance boxes (the reference's data set).

        Raises:
            UserInputError: a ``NETWORK.WITH_*_LOSS`` switch on, or ``IMAGE_FEAT_PRECOMPUTED`` (this data set
                draws no masks and reads pixels); see :func:`read_coco_captions`.
        """
        net, d = cfg.NETWORK, cfg.DATASET
        on = [k for k in ("WITH_REL_LOSS", "WITH_MLM_LOSS", "WITH_MVRC_LOSS", "IMAGE_FEAT_PRECOMPUTED") if net[k]]
        if on:
            raise UserInputError("DATASET.DATASET coco_captions serves attention maps (unmasked captions, "
                                 "images): set NETWORK.{} to false".format(", NETWORK.".join(on)))
        items = read_coco_captions(d.DATASET_PATH, d["{}_IMAGE_SET".format(mode.upper())], d.ZIP_MODE)
        return cls(items, build_tokenizer(net.BERT_MODEL_NAME), seq_len=d.SEQ_LEN,
                   add_image_as_a_box=d.ADD_IMAGE_AS_A_BOX, transform=transform)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, key):
        return self.load(resolve_key(key)[0])[0]

    def load(self, index):
        """``(sample, info)`` of item ``index``.

        ``sample``: the tuple of ``data_names``. ``info``: ``image`` (``PIL.Image`` as decoded), ``boxes``
        float32 [R, 4] the regions in pixels of that image (after the cut), ``tokens`` the R + text word pieces
        as strings (text first: ``[CLS] ... [SEP]``, then ``[IMAGE]`` for the whole-image box and
        ``[REGION k]``, k = the box's position in the item's box list, from 0).
        """
        item = self.items[index]
        try:
            image = load_image(item.image, item.recorded_size, "the box source")
        except (OSError, UserInputError) as e:  # missing, truncated or undecodable
            raise UnreadableImageError("image '{}' (image_id {}): {}".format(item.image, item.image_id, e)) from None
        width, height = image.size
        boxes = item.boxes if item.boxes is not None else grid_boxes(width, height, *self.grid, whole_image=False,
                                                                     name=item.image)
        check_image_size(item.image, image.size, item.recorded_size, "the box source", boxes)
        boxes = boxes.clone()
        clip_boxes_(boxes, width, height)
        names = ["[REGION {}]".format(k) for k in range(len(boxes))]
        if self.add_image_as_a_box:
            boxes = torch.cat([torch.tensor([[0.0, 0.0, width - 1.0, height - 1.0]]), boxes])
            names.insert(0, "[IMAGE]")
        words = ["[CLS]"] + self.tokenizer.tokenize(item.caption) + ["[SEP]"]
        keep_text, keep_regions = truncate_text_and_regions(len(words), len(boxes), self.seq_len)
        words = words[:keep_text - 1] + words[-1:]
        boxes, names = boxes[:keep_regions], names[:keep_regions]
        im_info = torch.tensor([width, height, 1.0, 1.0, index], dtype=torch.float32)
        sample = {"image": image, "boxes": boxes.clone(), "im_info": im_info}
        if self.transform is not None:
            sample = self.transform(sample)
        clip_boxes_(sample["boxes"], sample["im_info"][0].item(), sample["im_info"][1].item())
        text = torch.tensor(self.tokenizer.convert_tokens_to_ids(words), dtype=torch.int64)
        info = {"image": image, "boxes": boxes, "tokens": words + names}
        return (sample["image"], sample["boxes"], sample["im_info"], text), info
