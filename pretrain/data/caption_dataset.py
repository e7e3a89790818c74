"""Conceptual Captions samples for pretraining: MLM with visual clues, masked RoI classification and
the caption-image relationship, every random draw from the sample's key (seed, epoch, index).

Files and fields: ``conceptual_captions.py`` and ``data/PREPARE_DATA.md``.
"""
import os

import torch
from torch.utils.data import Dataset

from common.data.loading import check_image_size, load_image
from common.data.samplers import resolve_key
from common.data.storage import storage_of
from common.data.skips import SkipCounter, read_or_skip
from common.data.tokenizer import build_tokenizer
from common.data.transforms import clip_boxes_
from common.errors import UserInputError

from .conceptual_captions import INDEX_FILE, CaptionDataError, load_detections, read_caption_index
from .masking import IGNORE, WholeWordMasker, mask_regions, region_pixel_mask, whole_image_feature
from .truncation import truncate_text_and_regions

# Images a run reads before the share of skipped ones is judged (see common.data.skips).
MIN_IMAGES_FOR_SHARE = 1000


class ConceptualCaptionsDataset(Dataset):
    """Image-caption pretraining samples in the reference's ``data_names`` order.

    Args:
        records: ``CaptionRecord`` list (``read_caption_index``); a subclass may hold another sequence of
            samples (``caption_shards.CaptionShardDataset``: a ``ShardIndex``) and override ``_regions``.
        tokenizer: ``BertTokenizer``.
        seq_len (int): text tokens plus regions at most (``DATASET.SEQ_LEN``); both are cut together
            (``truncation.truncate_text_and_regions``).
        precomputed (bool): ``NETWORK.IMAGE_FEAT_PRECOMPUTED``: regions carry the detector's 2048-d
            features and no image is read (``image`` is None).
        mask_raw_pixels (bool): ``NETWORK.MASK_RAW_PIXELS``: zero the pixels of replaced regions
            (images only).
        with_rel, with_mlm, with_mvrc (bool): ``NETWORK.WITH_{REL,MLM,MVRC}_LOSS``; a task that is off
            draws nothing (label 1 / all-ignore labels / all-zero ops).
        add_image_as_a_box (bool): region 0 is the whole image (never masked; with precomputed
            features its feature is the mean of the regions that are not replaced).
        transform: ``common.data.transforms`` pipeline for the image, boxes and caption (a flip also swaps
            left/right in the caption). Unused when precomputed: boxes stay in the detector's pixels (the
            reference resized and flipped them there, without flipping the features).
        skips (SkipCounter): counts unreadable images; such a sample takes the next readable one's
            image, detections and caption.
        allow_empty (bool): no records (:meth:`for_items`).
        num_classes (int): width of the MVRC targets (``NETWORK.VLBERT.visual_region_classes``); a
            detector file's ``classes`` must have it when ``with_mvrc``, and without ``with_mvrc`` a file
            may have no ``classes`` (boxes from a grid or a file) and gets all-zero targets of this width.

    Items (``dataset[key]``, key an int or a ``SampleKey``): ``image`` float ``(3, H, W)`` or None;
    ``boxes`` float ``(N, 4)`` pixels of the transformed image, or ``(N, 4 + 2048)`` with features;
    ``im_info`` float ``(5,)`` ``width, height, scale_x, scale_y, index``; ``text`` int64 ``(L,)``
    ``[CLS] caption [SEP]`` word pieces; ``relationship_label`` int64 ``()`` (1: the image's own
    caption, 0: another one's); ``mlm_labels`` int64 ``(L,)`` (-1: not predicted); ``mvrc_ops`` int64
    ``(N,)`` (1: region replaced); ``mvrc_labels`` float ``(N, num_classes)`` (zero rows: not predicted).

    Raises:
        common.data.skips.TooManySkipsError: unreadable images past the allowed share.
        CaptionDataError / FileNotFoundError: a broken or missing detector file (no tolerance), ``classes``
            of another width than ``num_classes`` (names the file and the key to set), or an image whose
            decoded (EXIF-rotated) size is not the file's ``image_w`` / ``image_h`` with a box beyond it.
    Warns:
        common.data.loading.ImageSizeWarning: decoded size unlike the detector file's, boxes within it.
    """

    data_names = ["image", "boxes", "im_info", "text", "relationship_label", "mlm_labels", "mvrc_ops",
                  "mvrc_labels"]
    # Label values the metrics and losses skip (a filler batch of a DATASET list's evaluation):
    # -100 is ``F.cross_entropy``'s ignore index, an all-zero MVRC target is no region to predict.
    ignored_labels = {"relationship_label": -100, "mlm_labels": IGNORE, "mvrc_labels": 0.0}

    def __init__(self, records, tokenizer, seq_len=64, precomputed=False, mask_raw_pixels=True, with_rel=True,
                 with_mlm=True, with_mvrc=True, add_image_as_a_box=True, transform=None, skips=None,
                 num_classes=1601, allow_empty=False):
        if not records and not allow_empty:
            raise ValueError("the Conceptual Captions index has no caption")
        self.records = records
        self.seq_len = seq_len
        self.precomputed = precomputed
        self.mask_raw_pixels = mask_raw_pixels
        self.with_rel = with_rel
        self.with_mvrc = with_mvrc
        self.num_classes = num_classes
        self.add_image_as_a_box = add_image_as_a_box
        self.transform = transform
        self.masker = WholeWordMasker(tokenizer, word_prob=0.15 if with_mlm else 0.0)
        self.skips = skips or SkipCounter("image", min_seen=max(1, min(MIN_IMAGES_FOR_SHARE, len(records))))

    @classmethod
    def from_config(cls, cfg, mode, transform=None):
        """Dataset of split ``mode`` from ``DATASET.{MODE}_IMAGE_SET`` (index ``{set}_frcnn.json`` under
        ``DATASET_PATH``), the ``NETWORK`` task switches and ``DATASET.MAX_SKIPPED_SHARE``.

        Raises:
            FileNotFoundError: no index file or no ``vocab.txt`` in ``NETWORK.BERT_MODEL_NAME``.
            UserInputError: a key of the 'cc_shards' data set is set.
        """
        d = cfg.DATASET
        for key in ("TRAIN_SHARDS", "VAL_SHARDS", "TEST_SHARDS", "GRID_BOXES"):
            if d.get(key):
                raise UserInputError("DATASET.{} is read by DATASET.DATASET 'cc_shards' only, not by "
                                     "'conceptual_captions'".format(key))
        image_set = d["{}_IMAGE_SET".format(mode.upper())]
        records = read_caption_index(os.path.join(d.DATASET_PATH, INDEX_FILE.format(image_set)), d.DATASET_PATH,
                                     storage_of(d))
        skips = SkipCounter("image", max_share=d.MAX_SKIPPED_SHARE,
                            min_seen=min(MIN_IMAGES_FOR_SHARE, len(records)), setting="DATASET.MAX_SKIPPED_SHARE")
        net = cfg.NETWORK
        return cls(records, build_tokenizer(net.BERT_MODEL_NAME), seq_len=d.SEQ_LEN,
                   precomputed=net.IMAGE_FEAT_PRECOMPUTED, mask_raw_pixels=net.MASK_RAW_PIXELS,
                   with_rel=net.WITH_REL_LOSS, with_mlm=net.WITH_MLM_LOSS, with_mvrc=net.WITH_MVRC_LOSS,
                   add_image_as_a_box=d.ADD_IMAGE_AS_A_BOX, transform=transform, skips=skips,
                   num_classes=net.VLBERT.visual_region_classes)

    def __len__(self):
        return len(self.records)

    def _readable(self, index):
        """(index, image) of the first record from ``index`` on whose image reads (None when precomputed)."""
        if self.precomputed:
            return index, None
        for step in range(len(self.records)):
            j = (index + step) % len(self.records)
            image = read_or_skip(load_image, self.records[j].image, self.skips)
            if image is not None:
                return j, image
        raise RuntimeError("no image of the Conceptual Captions index could be read")  # only with max_share 1

    def _regions(self, index):
        """``(index, image, detections, caption tokens)`` of the first readable sample from ``index`` on (the
        index it was found at; image None when precomputed)."""
        index, image = self._readable(index)
        record = self.records[index]
        det = load_detections(record.frcnn, with_features=self.precomputed, with_classes=self.with_mvrc)
        self._check_class_width(det, "detector file '{}'".format(record.frcnn))
        if image is not None:
            check_image_size(record.image, image.size, (det.width, det.height), "detector file '{}'".format(
                record.frcnn), det.boxes, error=CaptionDataError)
        return index, image, det, record.caption

    def _check_class_width(self, det, where):
        """With MVRC, the detector's ``classes`` must be as wide as the MVRC head (names ``where`` and the key)."""
        if self.with_mvrc and det.cls_scores.shape[1] != self.num_classes:
            raise CaptionDataError("{}: 'classes' has {} classes per region, the MVRC head {} "
                                   "(NETWORK.VLBERT.visual_region_classes; 91 for torchvision's COCO detectors)"
                                   .format(where, det.cls_scores.shape[1], self.num_classes))

    def _other_caption(self, index):
        """Caption tokens of sample ``index`` for a mismatched pair (None: unreadable, the pair stays matched)."""
        return self.records[index].caption

    def _caption(self, index, caption, generator):
        """(caption tokens, relationship label): half the time another sample's caption, label 0."""
        if self.with_rel and len(self) > 1 and torch.rand((), generator=generator) >= 0.5:
            other = int(torch.randint(len(self) - 1, (), generator=generator))
            other_caption = self._other_caption(other + (other >= index))
            if other_caption is not None:
                return other_caption, 0
        return caption, 1

    @classmethod
    def for_items(cls, cfg, transform=None):
        """A data set of the config's item layout without records, nothing drawn at random (no masking, no
        mismatched caption): :meth:`item` builds its items (the predictor's, ``pretrain/predict.py``)."""
        net = cfg.NETWORK
        return cls([], build_tokenizer(net.BERT_MODEL_NAME), seq_len=cfg.DATASET.SEQ_LEN,
                   precomputed=net.IMAGE_FEAT_PRECOMPUTED, mask_raw_pixels=net.MASK_RAW_PIXELS, with_rel=False,
                   with_mlm=False, with_mvrc=False, add_image_as_a_box=cfg.DATASET.ADD_IMAGE_AS_A_BOX,
                   transform=transform, num_classes=net.VLBERT.visual_region_classes, allow_empty=True)

    def __getitem__(self, key):
        index, generator = resolve_key(key)
        return self.item(*self._regions(index), generator)

    def item(self, index, image, det, caption, generator=None):
        """The item's tuple (``data_names`` order) of one sample's parts: its index (stored in ``im_info[4]``),
        image (RGB ``PIL.Image``, None when precomputed), ``Detections`` and caption words; ``generator`` draws
        the masking, the mismatched caption and the random transforms."""
        boxes = det.boxes.clone()
        w0, h0 = (det.width, det.height) if image is None else image.size
        if self.add_image_as_a_box:
            boxes = torch.cat([torch.tensor([[0.0, 0.0, w0 - 1.0, h0 - 1.0]]), boxes])
        im_info = torch.tensor([w0, h0, 1.0, 1.0, index], dtype=torch.float32)
        caption, relationship_label = self._caption(index, caption, generator)
        if image is not None and self.transform is not None:
            sample = self.transform({"image": image, "boxes": boxes, "im_info": im_info, "texts": [caption],
                                     "generator": generator})
            image, boxes, im_info, caption = sample["image"], sample["boxes"], sample["im_info"], sample["texts"][0]
        clip_boxes_(boxes, im_info[0].item(), im_info[1].item())

        text, mlm_labels = self.masker.caption(self.masker.words(" ".join(caption)), generator)
        num_classes = self.num_classes
        if self.with_mvrc:
            ops, mvrc_labels = mask_regions(det.cls_scores, generator)
        else:
            ops, mvrc_labels = torch.zeros(len(det.boxes), dtype=torch.int64), torch.zeros(len(det.boxes), num_classes)
        if self.precomputed:
            features = det.features
            if self.add_image_as_a_box:
                features = torch.cat([whole_image_feature(features, ops)[None], features])
        if self.add_image_as_a_box:
            ops = torch.cat([torch.zeros(1, dtype=torch.int64), ops])
            mvrc_labels = torch.cat([torch.zeros(1, num_classes), mvrc_labels])
        if image is not None and self.mask_raw_pixels:
            image = image.masked_fill(region_pixel_mask(boxes, ops, image.shape[1], image.shape[2]), 0.0)
        if self.precomputed:
            boxes = torch.cat([boxes, features], 1)

        keep_text, keep_regions = truncate_text_and_regions(len(text), len(boxes), self.seq_len)
        if keep_text < len(text):
            text = torch.cat([text[:keep_text - 1], text[-1:]])
            mlm_labels = torch.cat([mlm_labels[:keep_text - 1], mlm_labels[-1:]])
        return (image, boxes[:keep_regions], im_info, text, torch.tensor(relationship_label), mlm_labels,
                ops[:keep_regions], mvrc_labels[:keep_regions])

