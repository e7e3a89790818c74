"""RefCOCO+ (Yu et al., ECCV 2016) referring expressions as VL-BERT items: which box does the text describe?

One item per expression (a ref has one or more). The candidates are boxes of the image (``*_BOXES``):
``gt`` the image's annotated objects, ``proposal`` detections (``PROPOSAL_SOURCE`` ``official``: MAttNet,
``vg``: the VQA precomputed boxes), ``proposal+gt`` (or ``gt+proposal``) both, detections first. A
candidate is a positive when its IoU with the referred box exceeds 0.5 (``refcoco.metrics``). Files and
layout: ``data/PREPARE_DATA.md``.
"""
import os

import torch
from torch.utils.data import Dataset

from common.data.collate import index_from_im_info
from common.data.loading import load_image
from common.data.samplers import resolve_key
from common.data.storage import container, stored_folder, storage_of
from common.data.tokenizer import build_tokenizer
from common.data.transforms import clip_boxes_

from ..metrics import positive_labels
from .proposals import MATTNET_DETECTIONS, VG_BOXES_FOLDER, VGBoxes, load_mattnet_detections
from .refer import INSTANCES_FILE, PREPARE_DOC, REFS_FILE, RefCOCODataError, Refer, xywh_to_xyxy

BOXES = ("gt", "proposal", "proposal+gt", "gt+proposal")
PROPOSAL_SOURCES = ("official", "vg")
DATASET_NAME = "refcoco+"
SPLIT_BY = "unc"
# Every RefCOCO+ image is a COCO train2014 image.
COCO_IMAGE_SET = "train2014"


def coco_image_path(data_path, image_id, storage="folder"):
    """``{data_path}/train2014/COCO_train2014_{image_id:012d}.jpg``, or inside ``train2014.zip`` (which holds
    the folder ``train2014/``) in 'zip' storage, ``train2014.lmdb`` (the same names) in 'lmdb' storage."""
    name = "COCO_{}_{:012d}.jpg".format(COCO_IMAGE_SET, image_id)
    return os.path.join(stored_folder(os.path.join(data_path, COCO_IMAGE_SET), storage), name)


def missing_data_paths(data_path, boxes, proposal_source, storage):
    """Paths the data set needs that do not exist (empty when all are there).

    Args:
        data_path: ``DATASET.DATASET_PATH``.
        boxes: the ``*_BOXES`` values in use; ``proposal_source``: ``DATASET.PROPOSAL_SOURCE``.
        storage: 'folder', 'zip' (images in ``train2014.zip``) or 'lmdb' (``train2014.lmdb``).
    """
    if not os.path.isdir(data_path):
        return ["DATASET.DATASET_PATH '{}' (folder)".format(data_path)]
    folder = os.path.join(data_path, DATASET_NAME)
    images = container(stored_folder(os.path.join(data_path, COCO_IMAGE_SET), storage))
    # (what to name in the message, paths of which one must exist)
    needed = [(p, [p]) for p in (os.path.join(folder, REFS_FILE.format(SPLIT_BY)), os.path.join(folder, INSTANCES_FILE),
                                 images)]
    if any("proposal" in b for b in boxes):
        if proposal_source == "official":
            detections = os.path.join(data_path, MATTNET_DETECTIONS)
            needed.append((detections, [detections]))
        else:
            vg = os.path.join(data_path, VG_BOXES_FOLDER)
            needed.append((vg + " (or .zip, .lmdb)", [vg, vg + ".zip", vg + ".lmdb"]))
    return [name for name, paths in needed if not any(os.path.exists(p) for p in paths)]


def load_items(refer, image_sets, data_path, storage="folder"):
    """One dict per expression of the splits ``image_sets`` (list of names), refs in :meth:`Refer.ref_ids`
    order and each ref's sentences in file order: ``sent_id``, ``ref_id``, ``ann_id``, ``split`` (the ref's
    own split field), ``image_id``, ``category_id``, ``image_fn``, ``width``, ``height``, ``tokens``."""
    items = []
    for split in image_sets:
        for ref_id in refer.ref_ids(split):
            ref = refer.refs[ref_id]
            image = refer.images[ref["image_id"]]
            for sentence in ref["sentences"]:
                items.append({
                    "sent_id": sentence["sent_id"], "ref_id": ref_id, "ann_id": ref["ann_id"], "split": ref["split"],
                    "image_id": ref["image_id"], "category_id": ref.get("category_id"),
                    "image_fn": coco_image_path(data_path, ref["image_id"], storage),
                    "width": image["width"], "height": image["height"], "tokens": sentence["tokens"],
                })
    return items


def referred_boxes(refer, items):
    """``[N, 4]`` float32 ``x1, y1, x2, y2`` (original pixels) of the object each of ``items`` refers to."""
    return xywh_to_xyxy([refer.annotations[item["ann_id"]]["bbox"] for item in items])


def split_referred_boxes(data_path, image_set):
    """The referred boxes of the ``image_set`` (names joined with '+') items, in the data set's index order,
    read from the REFER files alone (no image, no proposal): what the accuracy metric needs.

    Raises:
        FileNotFoundError, RefCOCODataError: as :class:`refcoco.data.refer.Refer`.
    """
    refer = Refer(data_path, DATASET_NAME, SPLIT_BY)
    return referred_boxes(refer, load_items(refer, [s.strip() for s in image_set.split("+")], data_path))


class RefCOCO(Dataset):
    """RefCOCO+ items in the order of ``data_names``.

    Args:
        image_set: split name (``train``, ``val``, ``testA``, ``testB``, ``test`` = both test splits), or
            several joined with ``+``.
        data_path: ``DATASET.DATASET_PATH``: ``refcoco+/``, ``train2014/`` (or ``train2014.zip``) and the
            proposal files (see ``data/PREPARE_DATA.md``).
        tokenizer: ``BertTokenizer`` (``common.data.tokenizer.build_tokenizer``).
        boxes: one of :data:`BOXES`.
        proposal_source: one of :data:`PROPOSAL_SOURCES` (used with proposals).
        transform: callable on a sample dict (``common.data.transforms``) or None.
        test_mode: no ``label`` field (the referred boxes stay known: RefCOCO+ test labels are public).
        storage: 'folder', 'zip' or 'lmdb': read images from ``train2014/``, ``train2014.zip`` or
            ``train2014.lmdb``.
        add_image_as_a_box: candidate 0 is the whole image ``[0, 0, w - 1, h - 1]``.

    Items: ``image`` float ``(3, H, W)`` (a ``PIL.Image`` without transform); ``boxes`` float ``(K, 4)``
    ``x1, y1, x2, y2`` in pixels of the transformed image, clipped to it; ``im_info`` float ``(5,)`` =
    ``width, height, scale_x, scale_y, index``; ``expression`` int64 ``(L,)`` word-piece ids (no
    ``[CLS]``/``[SEP]``); ``label`` float ``(K,)`` 1.0 for candidates with IoU > 0.5 with the referred box
    (computed after the transform, as the reference does). A horizontal flip also swaps "left" and
    "right" in the expression (``common.data.transforms``).

    ``dataset[key]`` takes an int or a ``common.data.samplers.SampleKey``; with a key, random transforms
    draw from ``key.generator()``.

    Differences from the reference: the ``gt`` candidates and the image sizes come from
    ``refcoco+/instances.json`` (the reference reads them from COCO's ``instances_train2014.json``, which
    holds the same objects for these images); an image without detections has no proposals (the
    reference stops with a KeyError); no database cache files are written.

    Raises:
        FileNotFoundError, RefCOCODataError, common.fileio.safe_load.UnreadableFileError: missing or bad data,
            naming the file (see :class:`refcoco.data.refer.Refer`); ValueError: bad arguments.
    """

    def __init__(self, image_set, data_path, tokenizer, boxes="gt", proposal_source="official", transform=None,
                 test_mode=False, storage="folder", add_image_as_a_box=False):
        if boxes not in BOXES:
            raise ValueError("DATASET.*_BOXES must be one of {}, got {!r}".format(", ".join(BOXES), boxes))
        if proposal_source not in PROPOSAL_SOURCES:
            raise ValueError("DATASET.PROPOSAL_SOURCE must be one of {}, got {!r}".format(
                ", ".join(PROPOSAL_SOURCES), proposal_source))
        self.data_path = data_path
        self.tokenizer = tokenizer
        self.boxes = boxes
        self.proposal_source = proposal_source
        self.transform = transform
        self.test_mode = test_mode
        self.add_image_as_a_box = add_image_as_a_box
        self.image_sets = [s.strip() for s in image_set.split("+")]
        self.refer = Refer(data_path, DATASET_NAME, SPLIT_BY)
        self.proposals = self.vg_boxes = None
        if "proposal" in boxes:
            if proposal_source == "official":
                self.proposal_file = os.path.join(data_path, MATTNET_DETECTIONS)
                self.proposals = load_mattnet_detections(self.proposal_file)
            else:
                self.vg_boxes = VGBoxes(data_path)
        self.items = load_items(self.refer, self.image_sets, data_path, storage)
        self.referred_boxes = referred_boxes(self.refer, self.items)
        self.item_builder = RefCOCOItems(tokenizer, transform, test_mode, add_image_as_a_box)

    @classmethod
    def from_config(cls, cfg, mode, transform=None):
        """Dataset of split ``mode`` ('train' / 'val' / 'test') from the reference's config keys
        (``DATASET.{MODE}_IMAGE_SET``, ``{MODE}_BOXES``, ``PROPOSAL_SOURCE``, ``DATASET_PATH``, ``ZIP_MODE``, ``LMDB_MODE``,
        ``ADD_IMAGE_AS_A_BOX``, ``NETWORK.BERT_MODEL_NAME``); ``test`` has no labels.

        Raises:
            FileNotFoundError: one message listing every missing data path and pointing to the data guide.
            ValueError: ``DATASET.CACHE_MODE`` is set (the reference does not support it either).
        """
        d = cfg.DATASET
        if d.CACHE_MODE:
            raise ValueError("DATASET.CACHE_MODE is not supported (the reference does not implement it either)")
        boxes = d["{}_BOXES".format(mode.upper())]
        missing = missing_data_paths(d.DATASET_PATH, [boxes], d.PROPOSAL_SOURCE, storage_of(d))
        if missing:
            raise FileNotFoundError("RefCOCO+ data not found: missing {}. See {} for how to get and lay out "
                                    "RefCOCO+.".format(", ".join(missing), PREPARE_DOC))
        return cls(d["{}_IMAGE_SET".format(mode.upper())], d.DATASET_PATH, build_tokenizer(cfg.NETWORK.BERT_MODEL_NAME),
                   boxes=boxes, proposal_source=d.PROPOSAL_SOURCE, transform=transform, test_mode=mode == "test",
                   storage=storage_of(d), add_image_as_a_box=d.ADD_IMAGE_AS_A_BOX)

    # ------------------------------------------------------------------ public helpers
    def __len__(self):
        return len(self.items)

    # Read by common.data.build.make_dataloader: each batch's dataset indices by name (batch.field("index")).
    batch_extras = {"index": index_from_im_info}

    @property
    def data_names(self):
        """Names of the item's fields, in order (the reference's order)."""
        return self.item_builder.data_names

    @property
    def splits(self):
        """The ``split`` field of each item's ref (``train``, ``val``, ``testA``, ``testB``), in index order."""
        return [item["split"] for item in self.items]

    @property
    def group_ids(self):
        """Aspect-ratio group per item: 0 when width >= height, else 1 (``TRAIN.ASPECT_GROUPING``)."""
        return [0 if item["width"] >= item["height"] else 1 for item in self.items]

    @property
    def ref_ids(self):
        """``ref_id`` of every item, in index order (for result files keyed by ref)."""
        return [item["ref_id"] for item in self.items]

    # ------------------------------------------------------------------ item
    def _proposals(self, image_id):
        if self.proposals is not None:
            return self.proposals.get(image_id, torch.zeros(0, 4))
        return self.vg_boxes(image_id)

    def candidate_boxes(self, index):
        """``[K, 4]`` float32 candidate boxes of item ``index`` in original image pixels, before the image box
        and the transform: detections first, then the annotated objects, as ``boxes`` selects."""
        image_id = self.items[index]["image_id"]
        parts = []
        if "proposal" in self.boxes:
            parts.append(self._proposals(image_id))
        if "gt" in self.boxes:
            parts.append(self.refer.image_boxes(image_id))
        return torch.cat(parts).float()

    def _image(self, item):
        image = load_image(item["image_fn"], (item["width"], item["height"]), "{} (image_id {})".format(
            self.refer.instances_file, item["image_id"]))
        if image.size != (item["width"], item["height"]):
            raise RefCOCODataError("{}: the image is {}x{} pixels but {} says {}x{} (image_id {}); the boxes "
                                   "would not match it".format(item["image_fn"], *image.size, self.refer.instances_file,
                                                               item["width"], item["height"], item["image_id"]))
        return image

    def item_source(self, index):
        """``(refs file, {'ref_id': r, 'sent_id': s})``: the referring expression item ``index`` reads."""
        item = self.items[index]
        return self.refer.refs_file, {"ref_id": item["ref_id"], "sent_id": item["sent_id"]}

    def __getitem__(self, key):
        index, generator = resolve_key(key)
        item = self.items[index]
        image = self._image(item)
        boxes = self.candidate_boxes(index)
        if boxes.shape[0] == 0 and not self.add_image_as_a_box:
            raise RefCOCODataError("image_id {} ({}) has no candidate box: no {} for it and "
                                   "DATASET.ADD_IMAGE_AS_A_BOX is off".format(
                                       item["image_id"], item["image_fn"], self.boxes))
        return self.item_builder(image, boxes, item["tokens"], index, self.referred_boxes[index], generator)


class RefCOCOItems:
    """One RefCOCO+ item from its parts, as :class:`RefCOCO` returns it (the data set and the predictor,
    ``refcoco/predict.py``, both build items here).

    Args:
        tokenizer: ``BertTokenizer``. transform: callable on a sample dict, or None.
        test_mode: no ``label`` field. add_image_as_a_box: candidate 0 is the whole image.
    """

    def __init__(self, tokenizer, transform=None, test_mode=False, add_image_as_a_box=False):
        self.tokenizer = tokenizer
        self.transform = transform
        self.test_mode = test_mode
        self.add_image_as_a_box = add_image_as_a_box

    @property
    def data_names(self):
        """Names of the item's fields, in order (the reference's order)."""
        names = ["image", "boxes", "im_info", "expression"]
        return names if self.test_mode else names + ["label"]

    def __call__(self, image, boxes, tokens, index, referred=None, generator=None):
        """The item's tuple (:attr:`data_names` order).

        Args:
            image: RGB ``PIL.Image``. boxes: float ``[K, 4]`` candidates in its pixels (before the image box).
            tokens: the expression's words. index: stored in ``im_info[4]``.
            referred: float ``[4]`` referred box (the label's; needed unless test mode).
            generator: ``torch.Generator`` of the random transforms, or None.
        """
        w, h = image.size
        if self.add_image_as_a_box:
            boxes = torch.cat([torch.tensor([[0.0, 0.0, w - 1.0, h - 1.0]]), boxes])
        # The referred box rides along as row 0 so that it is resized and flipped with the candidates.
        boxes = torch.cat([(boxes.new_zeros(4) if referred is None else referred)[None], boxes])
        sample = {"image": image, "boxes": boxes, "texts": [tokens], "generator": generator,
                  "im_info": torch.tensor([w, h, 1.0, 1.0, index], dtype=torch.float32)}
        if self.transform is not None:
            sample = self.transform(sample)
        im_info = sample["im_info"]
        referred, boxes = clip_boxes_(sample["boxes"], im_info[0].item(), im_info[1].item()).split(
            [1, boxes.shape[0] - 1])
        pieces = self.tokenizer.tokenize(" ".join(sample["texts"][0]))
        expression = torch.tensor(self.tokenizer.convert_tokens_to_ids(pieces), dtype=torch.int64)
        out = {"image": sample["image"], "boxes": boxes, "im_info": im_info, "expression": expression}
        if not self.test_mode:
            out["label"] = positive_labels(boxes, referred[0])
        return tuple(out[name] for name in self.data_names)
