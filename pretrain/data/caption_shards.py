"""Conceptual Captions (or any image-caption set) from webdataset / img2dataset tar shards: ``DATASET.DATASET:
'cc_shards'``.

A sample is the members of one key in a shard (``common.data.tar_shards``):

- ``{key}.jpg`` (or ``.jpeg``, ``.png``, ``.webp``): the image (not read with ``NETWORK.IMAGE_FEAT_PRECOMPUTED``);
- ``{key}.txt``: the caption (UTF-8 text; split on white space into tokens), or else the ``caption`` field of
  ``{key}.json`` (a string, or a list of tokens as in the reference's index);
- ``{key}.json`` (optional): a JSON object; its detector fields, those of the reference's per-image detector
  file (``num_boxes``, ``image_w``, ``image_h``, ``boxes``, ``classes``, ``features``: see
  ``conceptual_captions.py``), give the regions; other fields (img2dataset's ``url``, ``status``...) are ignored;
- ``{key}.npy`` (optional): float32 ``(num_boxes, D)`` features of those boxes, in the JSON's box order,
  used instead of its base64 ``features``.

Without detector output, ``DATASET.GRID_BOXES: 'ROWSxCOLS'`` gives each image a grid of regions
(``common.data.box_sources.grid_boxes``, in pixels of the decoded image, so any image encoder that pools
regions from boxes reads them); grid regions carry no detector classes, so masked RoI classification
(``NETWORK.WITH_MVRC_LOSS``) is refused, as are precomputed features.

Reading by member offset (not webdataset's stream reader) gives exact mid-epoch resume: see the
``common.data.tar_shards`` docstring. A sample whose image, caption, detector JSON or features cannot be read is
skipped and counted (``DATASET.MAX_SKIPPED_SHARE``); it takes the next readable sample's place.

Keys: ``DATASET.{TRAIN,VAL,TEST}_SHARDS`` (brace patterns under ``DATASET_PATH``), ``DATASET.SHUFFLE_BUFFER``,
``DATASET.GRID_BOXES``; ``tools/convert_cc_shards.py`` converts the reference's layout to shards and back.
"""
import io

import numpy as np
import torch

from common.data.box_sources import grid_boxes, parse_grid
from common.data.loading import check_image_size, decode_image, parse_json
from common.data.skips import SkipCounter
from common.data.tar_shards import ShardIndex, epoch_order, expand_shards
from common.data.tokenizer import build_tokenizer
from common.errors import UserInputError

from .caption_dataset import MIN_IMAGES_FOR_SHARE, ConceptualCaptionsDataset
from .conceptual_captions import CaptionDataError, Detections, detections_from_json

class CaptionShardDataset(ConceptualCaptionsDataset):
    """Pretraining samples of tar shards, as :class:`ConceptualCaptionsDataset` gives them for the reference's
    layout (same ``data_names``, masks and relationship draws from the ``SampleKey``).

    Args:
        index (ShardIndex): the samples.
        tokenizer: ``BertTokenizer``.
        grid (tuple or None): ``(rows, cols)`` grid regions instead of the shard's detector output.
        shuffle_buffer (int): samples of the shuffle buffer of :meth:`epoch_order`.
        **kwargs: the other arguments of :class:`ConceptualCaptionsDataset` (``skips`` counts samples).

    Raises:
        UserInputError: grid regions with precomputed features or masked RoI classification.
    """

    def __init__(self, index, tokenizer, grid=None, shuffle_buffer=1000, **kwargs):
        kwargs.setdefault("skips", SkipCounter("sample", min_seen=min(MIN_IMAGES_FOR_SHARE, len(index))))
        super().__init__(index, tokenizer, **kwargs)
        if grid is not None and self.precomputed:
            raise UserInputError("DATASET.GRID_BOXES: grid regions have no precomputed features; set "
                                 "NETWORK.IMAGE_FEAT_PRECOMPUTED false or use the shards' detector output")
        if grid is not None and self.with_mvrc:
            raise UserInputError("DATASET.GRID_BOXES: grid regions have no detector classes to predict; set "
                                 "NETWORK.WITH_MVRC_LOSS false or use the shards' detector output")
        self.grid = grid
        self.shuffle_buffer = shuffle_buffer
        self._order = (None, None)

    @classmethod
    def from_config(cls, cfg, mode, transform=None):
        """Dataset of split ``mode``: the shards of ``DATASET.{MODE}_SHARDS`` under ``DATASET_PATH``, indexed.

        Raises:
            common.data.tar_shards.ShardError: no pattern, missing shard files, a file that is not a tar.
            UserInputError: a bad ``DATASET.GRID_BOXES`` or one that the ``NETWORK`` switches exclude.
            FileNotFoundError: no ``vocab.txt`` in ``NETWORK.BERT_MODEL_NAME``.
        """
        d, net = cfg.DATASET, cfg.NETWORK
        setting = "DATASET.{}_SHARDS".format(mode.upper())
        index = ShardIndex.build(expand_shards(d[setting.split(".")[1]], d.DATASET_PATH, setting))
        skips = SkipCounter("sample", max_share=d.MAX_SKIPPED_SHARE, min_seen=min(MIN_IMAGES_FOR_SHARE, len(index)),
                            setting="DATASET.MAX_SKIPPED_SHARE")
        return cls(index, build_tokenizer(net.BERT_MODEL_NAME), grid=parse_grid(d.GRID_BOXES, "DATASET.GRID_BOXES"),
                   num_classes=net.VLBERT.visual_region_classes, shuffle_buffer=d.SHUFFLE_BUFFER, seq_len=d.SEQ_LEN,
                   precomputed=net.IMAGE_FEAT_PRECOMPUTED, mask_raw_pixels=net.MASK_RAW_PIXELS,
                   with_rel=net.WITH_REL_LOSS, with_mlm=net.WITH_MLM_LOSS, with_mvrc=net.WITH_MVRC_LOSS,
                   add_image_as_a_box=d.ADD_IMAGE_AS_A_BOX, transform=transform, skips=skips)

    def epoch_order(self, seed, epoch):
        """The training order of ``epoch`` (``common.data.tar_shards.epoch_order``; the sampler asks for it)."""
        if self._order[0] != (seed, epoch):
            self._order = ((seed, epoch), epoch_order(self.records.counts, seed, epoch, self.shuffle_buffer))
        return self._order[1]

    def _regions(self, index):
        for step in range(len(self)):
            j = (index + step) % len(self)
            try:
                image, det, caption = self._load(j)
            except (OSError, UserInputError) as e:  # missing, truncated or undecodable member
                self.skips.skip(self.records.name(j), e)
                continue
            self.skips.ok()
            return j, image, det, caption
        raise RuntimeError("no sample of the shards could be read")  # only with MAX_SKIPPED_SHARE 1

    def _meta(self, j):
        """The ``.json`` object of sample ``j``, or None when it has none."""
        if not self.records.has(j, "json"):
            return None
        name = self.records.name(j, "json")
        meta = parse_json(self.records.read(j, "json"), name)
        if not isinstance(meta, dict):
            raise CaptionDataError("{}: expected a JSON object, got {}".format(name, type(meta).__name__))
        return meta

    def _caption_tokens(self, j, meta):
        """Caption tokens (list of str) of sample ``j`` from ``.txt``, else from ``meta['caption']``."""
        index = self.records
        if index.has(j, "txt"):
            name, data = index.name(j, "txt"), index.read(j, "txt")
            try:
                caption = data.decode("utf-8")
            except UnicodeDecodeError as e:
                raise CaptionDataError("{}: not UTF-8 text ({})".format(name, e)) from None
        elif meta is not None and "caption" in meta:
            name, caption = index.name(j, "json"), meta["caption"]
        else:
            raise CaptionDataError("{}: no caption (no .txt member, no 'caption' in a .json member)".format(
                index.name(j)))
        if isinstance(caption, list) and all(isinstance(t, str) for t in caption):
            caption = " ".join(caption)
        if not isinstance(caption, str) or not caption.split():
            raise CaptionDataError("{}: the caption must be non-empty text, got {!r}".format(name, caption))
        return caption.split()

    def _load(self, j):
        """``(image, detections, caption tokens)`` of sample ``j`` (image None when precomputed)."""
        index = self.records
        # grid regions need the JSON only for a caption (it may hold megabytes of base64 features)
        meta = self._meta(j) if self.grid is None or not index.has(j, "txt") else None
        caption = self._caption_tokens(j, meta)
        image = None if self.precomputed else decode_image(index.read(j, "image"), index.name(j, "image"))
        if self.grid is not None:
            boxes = grid_boxes(image.width, image.height, *self.grid, whole_image=False, name=index.name(j, "image"))
            return image, Detections(boxes, torch.zeros(len(boxes), self.num_classes), None, *image.size), caption
        if meta is None or "boxes" not in meta:
            raise CaptionDataError("{}: no detector output (a .json member with 'boxes'); set DATASET.GRID_BOXES "
                                   "for shards without boxes".format(index.name(j)))
        features = self._npy_features(j) if self.precomputed and index.has(j, "npy") else None
        det = detections_from_json(meta, index.name(j, "json"), self.precomputed, features, with_classes=self.with_mvrc)
        self._check_class_width(det, index.name(j, "json"))
        if image is not None:
            check_image_size(index.name(j, "image"), image.size, (det.width, det.height), index.name(j, "json"),
                             det.boxes, error=CaptionDataError)
        return image, det, caption

    def _npy_features(self, j):
        """float32 tensor ``(num_boxes, D)`` of the ``.npy`` member (no pickled objects)."""
        name = self.records.name(j, "npy")
        try:
            array = np.load(io.BytesIO(self.records.read(j, "npy")), allow_pickle=False)
        except ValueError as e:
            raise CaptionDataError("{}: not a numeric .npy array ({})".format(name, e)) from None
        if array.ndim != 2:
            raise CaptionDataError("{}: expected features (num_boxes, D), got shape {}".format(name, array.shape))
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))

    def _other_caption(self, index):
        try:
            return self._caption_tokens(index, self._meta(index) if not self.records.has(index, "txt") else None)
        except (OSError, UserInputError):  # counted when the sample itself is read
            return None
