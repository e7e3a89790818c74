"""Visual Commonsense Reasoning (VCR, Zellers et al., CVPR 2019) dataset in the release format.

One annotation per jsonl line (see ``data/PREPARE_DATA.md`` and ``LEGACY.md``); per image a
metadata JSON with ``boxes`` (``[x1, y1, x2, y2, score]``), ``segms`` (polygons), ``width``,
``height``. Text tokens are words or lists of object indices; each reference is replaced by
the object's name (people get gender-neutral first names) and its word pieces carry the index
of the object's box, which is how VL-BERT grounds text in regions.
"""
import os

import torch
from pytorch_pretrained_bert import BasicTokenizer
from skimage.draw import polygon as draw_polygon
from torch.utils.data import Dataset

from common.data.collate import index_from_im_info
from common.data.loading import (check_boxes_inside, check_image_size, image_size, load_image, load_json,
                                 read_json_lines)
from common.data.samplers import resolve_key
from common.data.storage import container, stored_folder, storage_of
from common.errors import UserInputError
from common.data.tokenizer import build_tokenizer
from common.data.transforms import clip_boxes_

PREPARE_DOC = "data/PREPARE_DATA.md"

# Names given to 'person' objects, in order of appearance (the reference's list).
GENDER_NEUTRAL_NAMES = ["Casey", "Riley", "Jessie", "Jackie", "Avery", "Jaime", "Peyton", "Kerry", "Jody",
                        "Kendall", "Frankie", "Pat", "Quinn"]

# Detector classes of VCR's boxes (COCO, names without spaces); the index is boxes[:, 5].
CATEGORIES = [
    "__background__", "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "trafficlight", "firehydrant", "stopsign", "parkingmeter", "bench", "bird", "cat", "dog", "horse", "sheep",
    "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase",
    "frisbee", "skis", "snowboard", "sportsball", "kite", "baseballbat", "baseballglove", "skateboard",
    "surfboard", "tennisracket", "bottle", "wineglass", "cup", "fork", "knife", "spoon", "bowl", "banana",
    "apple", "sandwich", "orange", "broccoli", "carrot", "hotdog", "pizza", "donut", "cake", "chair", "couch",
    "pottedplant", "bed", "diningtable", "toilet", "tv", "laptop", "mouse", "remote", "keyboard", "cellphone",
    "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors", "teddybear",
    "hairdrier", "toothbrush"]
CATEGORY_TO_INDEX = {c: i for i, c in enumerate(CATEGORIES)}

NUM_CHOICES = 4
TASKS = ("Q2A", "QA2R", "Q2AR")


class VCRDataError(UserInputError):
    """Bad VCR data; the message names the file (and jsonl line) and the problem."""


def align_matrix(align_ids):
    """Word <- word-piece averaging matrix.

    Args:
        align_ids (list of int): word index of each word piece (non-decreasing).
    Returns:
        float32 tensor ``(num_words, num_pieces)``; row ``w`` averages the pieces of word ``w``
        (``max(align_ids) + 1`` rows; rows of words with no piece left are all zero).
    """
    n = len(align_ids)
    rows = max(align_ids) + 1 if n else 0
    m = torch.zeros(rows, n)
    if n:
        m[torch.as_tensor(align_ids), torch.arange(n)] = 1.0
        m = m / m.sum(1, keepdim=True).clamp(min=1.0)
    return m


def _object_refs(tokens):
    return [o for t in tokens if isinstance(t, list) for o in t]


def keep_only_relevant(texts):
    """Objects referenced in ``texts``, in order of first mention, and texts renumbered to them.

    Args:
        texts (list of token lists): question, answers, (rationales).
    Returns:
        (kept, new_texts): ``kept[i]`` is the original index of new object ``i``.
    """
    kept, new_index = [], {}
    for tokens in texts:
        for o in _object_refs(tokens):
            if o not in new_index:
                new_index[o] = len(kept)
                kept.append(o)
    renumbered = [[[new_index[o] for o in t] if isinstance(t, list) else t for t in tokens] for tokens in texts]
    return kept, renumbered


def polygon_mask(polygons, box, mask_size):
    """Rasterise an object's polygons into a ``mask_size`` grid spanning its box, as the reference does
    (``common/utils/mask.py`` ``generate_instance_mask`` of jackroos/VL-BERT).

    Each vertex is moved into mask cells in float32, ``(x - x1) * mw / (x2 - x1 + 1)`` and
    ``(y - y1) * mh / (y2 - y1 + 1)``, clamped into ``[0, mw - 1]`` and ``[0, mh - 1]``; the cells
    ``skimage.draw.polygon`` fills (centre inside or on the outline: a polygon around no cell centre
    marks nothing) are set, OR-ed over the parts. (The reference's square masks cannot tell its
    ``mask_size[0]`` on x from the width used here.)

    Args:
        polygons (list of list of [x, y]): the object's parts, image pixel coordinates; an empty
            part marks nothing.
        box (sequence): ``x1, y1, x2, y2`` (inclusive pixels); more values are ignored.
        mask_size (tuple): ``(height, width)`` of the mask.
    Returns:
        float32 tensor ``mask_size`` of 0/1.
    Raises:
        ValueError: a part that is not a list of ``[x, y]`` pairs.
    """
    mh, mw = mask_size
    mask = torch.zeros(mask_size)
    for poly in polygons:
        if len(poly) == 0:
            continue
        try:
            xy = torch.as_tensor(poly, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError):  # ragged or not numbers
            xy = None
        if xy is None or xy.dim() != 2 or xy.shape[1] != 2:
            raise ValueError("a polygon must be a list of [x, y] points, got {}".format(str(poly)[:80]))
        x = ((xy[:, 0] - box[0]) * (mw / (box[2] - box[0] + 1))).clamp(0, mw - 1)
        y = ((xy[:, 1] - box[1]) * (mh / (box[3] - box[1] + 1))).clamp(0, mh - 1)
        rr, cc = draw_polygon(y.numpy(), x.numpy())
        mask[rr, cc] = 1.0
    return mask


class VCRDataset(Dataset):
    """VCR items as tensors, in the order of ``data_names``.

    Args:
        ann_file (str): jsonl file name under ``data_path`` (``train.jsonl``...); None: no items but those
            :meth:`item` builds.
        image_set (str): image folder under ``data_path`` (``vcr1images``); in 'zip' storage the
            archive ``{data_path}/{image_set}.zip`` holding the folder ``{image_set}/``, in 'lmdb' storage
            the store ``{image_set}.lmdb`` holding the same names (``common.data.storage.stored_folder``).
        data_path (str): ``DATASET.DATASET_PATH``.
        tokenizer: ``BertTokenizer`` (see ``common.data.tokenizer.build_tokenizer``).
        transform: callable on a sample dict (``common.data.transforms``) or None.
        task (str): ``'Q2A'``, ``'QA2R'`` or ``'Q2AR'``.
        test_mode (bool): no labels in the file, none returned.
        storage (str): 'folder', 'zip' or 'lmdb' (``common.data.storage.STORAGES``): where images and
            metadata are read from.
        only_use_relevant_dets (bool): keep only the objects the texts mention (question and
            answers, plus rationales unless Q2A), renumbered in order of first mention.
        add_image_as_a_box (bool): box 0 is the whole image; text tags shift by one.
        mask_size (tuple of int): ``(M, M)`` instance mask size.
        basic_align (bool): align word pieces to BERT basic-tokenizer words instead of the
            annotation's words.
        qa2r_noq (bool): in QA2R the query is the right answer alone, without the question.
        seq_len (int): max word pieces of query + response (truncated like the reference).

    Items (``data_names`` order, Q2A): ``image`` float (3, H, W); ``boxes`` float (K, 6) =
    ``x1, y1, x2, y2, score, class`` (class index in ``CATEGORIES``, 0 for names outside it;
    the whole-image box has score 1 and class 0); ``masks`` float (K, M, M); ``question`` int64
    (Lq, 3); ``question_align_matrix`` float (Wq, Lq); ``answer_choices`` list of 4 int64
    (La_i, 3); ``answer_align_matrix`` list of 4 float (Wa_i, La_i); ``answer_label`` int64 ();
    ``im_info`` float (5,) = ``width, height, scale_x, scale_y, index``. Text rows are
    ``(token id, box index or -1 (0 with the image box) for words, word index)``.
    QA2R replaces question/answers by the query (question + right answer, block-diagonal
    align matrix; in test mode one query per answer candidate, stacked lists) and
    ``rationale_choices / _align_matrix / _label``; Q2AR has both.

    ``masks`` come from the metadata ``segms`` (all ones where a file has none). Without a
    ``transform`` ``image`` stays a ``PIL.Image``; a flip in ``transform`` also swaps
    left/right in the texts (see ``common.data.transforms``).

    ``dataset[key]`` takes an int or a ``common.data.samplers.SampleKey`` (what the loaders of
    ``make_dataloader`` yield); with a key, random transforms draw from ``key.generator()``,
    so an item depends only on ``(seed, epoch, index)``, whatever worker or rank loads it.

    Differences from the reference: person names restart at "Casey" in every item (the
    reference continues a counter across items, so a sample's text depended on load order);
    QA2R truncation counts the question only when it is part of the query; in test-mode QA2R
    the longest answer sets the truncation; Q2AR is supported (the reference raises).

    Raises:
        VCRDataError / FileNotFoundError: bad or missing data, naming the file (and the jsonl
            line): missing annotation/image/metadata file, undecodable image, invalid JSON,
            missing field, object index out of range, box count != object count, a malformed
            polygon, an image whose decoded (EXIF-rotated) size is not the metadata's ``width`` /
            ``height`` with a box beyond it.
    Warns:
        common.data.loading.ImageSizeWarning: decoded size unlike the metadata's, boxes within it.
    """

    def __init__(self, ann_file, image_set, data_path, tokenizer, transform=None, task="Q2A", test_mode=False,
                 storage="folder", only_use_relevant_dets=False, add_image_as_a_box=False, mask_size=(14, 14),
                 basic_align=False, qa2r_noq=False, seq_len=64):
        if task not in TASKS:
            raise ValueError("DATASET.TASK must be one of {}, got {!r}".format(TASKS, task))
        self.ann_file = os.path.join(data_path, ann_file) if ann_file else "input"
        self.image_root = stored_folder(os.path.join(data_path, image_set), storage)
        self.tokenizer = tokenizer
        self.basic_tokenizer = BasicTokenizer(do_lower_case=True)
        self.transform = transform
        self.task = task
        self.test_mode = test_mode
        self.only_use_relevant_dets = only_use_relevant_dets
        self.add_image_as_a_box = add_image_as_a_box
        self.mask_size = tuple(mask_size)
        self.basic_align = basic_align
        self.qa2r_noq = qa2r_noq
        self.seq_len = seq_len
        # No annotation file: items come from item() only (the predictor's).
        self.annotations = self._load_annotations() if ann_file else []
        self._group_ids = None

    @classmethod
    def from_config(cls, cfg, mode, transform=None):
        """Dataset of split ``mode`` ('train' / 'val' / 'test') from the reference's config keys
        (``DATASET.*``, ``NETWORK.BERT_MODEL_NAME``); ``test`` is unlabelled.

        Raises:
            FileNotFoundError: one message listing every missing data path (data folder,
                annotation file, image set folder, zip or LMDB store) and pointing to ``data/PREPARE_DATA.md``;
                or the BERT folder lacks ``vocab.txt``.
        """
        d = cfg.DATASET
        for key in ("CACHE_MODE", "QA2R_AUG"):
            if d[key]:
                raise ValueError("DATASET.{} is not supported (the reference does not implement it either)".format(key))
        ann_file = d["{}_ANNOTATION_FILE".format(mode.upper())]
        image_set = d["{}_IMAGE_SET".format(mode.upper())]
        check_data_paths(d.DATASET_PATH, [(ann_file, image_set)], storage_of(d))
        return cls(ann_file, image_set, d.DATASET_PATH, build_tokenizer(cfg.NETWORK.BERT_MODEL_NAME),
                   transform=transform, test_mode=mode == "test", storage=storage_of(d), **cls._options(cfg))

    @classmethod
    def for_items(cls, cfg, transform=None):
        """A test-mode data set of the config's item layout without annotations: :meth:`item` builds its items."""
        return cls(None, "", "", build_tokenizer(cfg.NETWORK.BERT_MODEL_NAME), transform=transform, test_mode=True,
                   **cls._options(cfg))

    @staticmethod
    def _options(cfg):
        d = cfg.DATASET
        return dict(task=d.TASK, only_use_relevant_dets=d.ONLY_USE_RELEVANT_DETS,
                    add_image_as_a_box=d.ADD_IMAGE_AS_A_BOX, mask_size=(d.MASK_SIZE, d.MASK_SIZE),
                    basic_align=d.BASIC_ALIGN, qa2r_noq=d.QA2R_NOQ)

    # ------------------------------------------------------------------ annotations
    def _required_fields(self):
        fields = ["annot_id", "img_fn", "metadata_fn", "objects", "question", "answer_choices"]
        if self.task != "Q2A":
            fields.append("rationale_choices")
        if not self.test_mode:
            fields.append("answer_label")
            if self.task != "Q2A":
                fields.append("rationale_label")
        return fields

    def _load_annotations(self):
        if not os.path.isfile(self.ann_file):
            raise FileNotFoundError("VCR annotation file '{}' not found (DATASET.DATASET_PATH / *_ANNOTATION_FILE);"
                                    " see {}".format(self.ann_file, PREPARE_DOC))
        fields = self._required_fields()
        annotations = []
        context = " (task {}{})".format(self.task, ", test mode" if self.test_mode else "")
        for line_no, where, ann in read_json_lines(self.ann_file, fields, VCRDataError, context):
            self.check_annotation(ann, where)
            annotations.append({
                "line": line_no,
                "annot_id": ann["annot_id"],
                "img_fn": os.path.join(self.image_root, ann["img_fn"]),
                "metadata_fn": os.path.join(self.image_root, ann["metadata_fn"]),
                "objects": ann["objects"],
                "question": ann["question"],
                "answer_choices": ann["answer_choices"],
                "rationale_choices": ann.get("rationale_choices"),
                "answer_label": None if self.test_mode else ann["answer_label"],
                "rationale_label": None if self.test_mode or self.task == "Q2A" else ann["rationale_label"],
            })
        return annotations

    def check_annotation(self, ann, where):
        """Raise VCRDataError (names ``where``) when an annotation has another number of choices than 4, refers
        to an object it does not list, or has a label outside 0..3."""
        num_objects = len(ann["objects"])
        texts = {"question": [ann["question"]], "answer_choices": ann["answer_choices"]}
        if self.task != "Q2A":
            texts["rationale_choices"] = ann["rationale_choices"]
        for name in ("answer_choices", "rationale_choices"):
            if name in texts and len(texts[name]) != NUM_CHOICES:
                raise VCRDataError("{}: expected {} {}, got {}".format(where, NUM_CHOICES, name, len(texts[name])))
        for name, choices in texts.items():
            for tokens in choices:
                for o in _object_refs(tokens):
                    if not isinstance(o, int) or not 0 <= o < num_objects:
                        raise VCRDataError("{}: {} refers to object {} but the line lists {} objects".format(
                            where, name, o, num_objects))
        for name in ("answer_label", "rationale_label"):
            if name in ann and not self.test_mode and ann[name] not in range(NUM_CHOICES):
                raise VCRDataError("{}: {} must be 0..{}, got {!r}".format(where, name, NUM_CHOICES - 1, ann[name]))

    # ------------------------------------------------------------------ public helpers
    @property
    def annot_ids(self):
        """``annot_id`` of every item, in index order (for leaderboard files)."""
        return [a["annot_id"] for a in self.annotations]

    @property
    def group_ids(self):
        """Aspect-ratio group per item (0: width >= height, 1: portrait), from the metadata
        ``width``/``height``; read on first use (one metadata file per image)."""
        if self._group_ids is None:
            sizes = {}
            for a in self.annotations:
                if a["metadata_fn"] not in sizes:
                    meta = self._load(load_json, a["metadata_fn"], a)
                    if "width" not in meta or "height" not in meta:
                        raise VCRDataError("{}: no 'width'/'height' (needed by TRAIN.ASPECT_GROUPING)".format(
                            a["metadata_fn"]))
                    sizes[a["metadata_fn"]] = 0 if meta["width"] >= meta["height"] else 1
            self._group_ids = [sizes[a["metadata_fn"]] for a in self.annotations]
        return self._group_ids

    # Read by common.data.build.make_dataloader: each batch's dataset indices by name (batch.field("index")).
    batch_extras = {"index": index_from_im_info}

    @property
    def data_names(self):
        """Names of the item's fields, in order (the reference's order)."""
        image = ["image", "boxes", "masks"]
        query = ["question", "question_align_matrix"]
        answers = ["answer_choices", "answer_align_matrix"] + ([] if self.test_mode else ["answer_label"])
        rationales = ["rationale_choices", "rationale_align_matrix"] + ([] if self.test_mode else ["rationale_label"])
        middle = {"Q2A": answers, "QA2R": rationales, "Q2AR": answers + rationales}[self.task]
        return image + query + middle + ["im_info"]

    def __len__(self):
        return len(self.annotations)

    # ------------------------------------------------------------------ item
    def _load(self, loader, path, ann):
        try:
            return loader(path)
        except (FileNotFoundError, ValueError) as e:
            raise type(e)("{} line {} (annot_id {}): {}".format(self.ann_file, ann["line"], ann["annot_id"], e)) \
                from None

    def _names(self, objects):
        names, people = [], 0
        for o in objects:
            if o == "person":
                names.append(GENDER_NEUTRAL_NAMES[people % len(GENDER_NEUTRAL_NAMES)])
                people += 1
            else:
                names.append(o)
        return names

    def _tokenize(self, tokens, names, word_tag):
        """VCR tokens -> (rows [id, tag, align], ...) as lists; see class docstring for tags."""
        pieces, tags, aligns = [], [], []
        word = 0

        def add(text, tag):
            nonlocal word
            wp = self.tokenizer.tokenize(text)
            pieces.extend(wp)
            tags.extend([tag] * len(wp))
            aligns.extend([word] * len(wp))
            word += 1

        for t in tokens:
            if isinstance(t, list):
                for k, o in enumerate(t):
                    if k > 0:
                        add("and", word_tag)
                    add(names[o], o + word_tag + 1)
            elif self.basic_align:
                for w in self.basic_tokenizer.tokenize(t):
                    add(w, word_tag)
            else:
                add(t, word_tag)
        ids = self.tokenizer.convert_tokens_to_ids(pieces)
        return [list(r) for r in zip(ids, tags, aligns)]

    def _boxes_and_masks(self, meta, objects, keep, ann, size):
        boxes_in = meta.get("boxes")
        if not isinstance(boxes_in, list) or len(boxes_in) != len(objects):
            raise VCRDataError("{} (for {} line {}): 'boxes' must list one box per object ({} objects), got {}".format(
                ann["metadata_fn"], self.ann_file, ann["line"], len(objects),
                "no 'boxes'" if boxes_in is None else "{} boxes".format(len(boxes_in))))
        segms = meta.get("segms")
        if segms is not None and len(segms) != len(objects):
            raise VCRDataError("{} (for {} line {}): 'segms' has {} entries for {} objects".format(
                ann["metadata_fn"], self.ann_file, ann["line"], len(segms), len(objects)))
        boxes = torch.zeros(len(keep), 6)
        masks = torch.ones(len(keep), *self.mask_size)
        for i, o in enumerate(keep):
            box = [float(v) for v in boxes_in[o]][:5]
            boxes[i, :len(box)] = torch.tensor(box)
            boxes[i, 5] = CATEGORY_TO_INDEX.get(objects[o], 0)
            if segms is not None:
                try:
                    masks[i] = polygon_mask(segms[o], box, self.mask_size)
                except (TypeError, ValueError) as e:
                    raise VCRDataError("{} (for {} line {}): 'segms' of object {}: {}".format(
                        ann["metadata_fn"], self.ann_file, ann["line"], o, e)) from None
        check_image_size(ann["img_fn"], size, *self._recorded_size(meta, ann), boxes, error=VCRDataError)
        if self.add_image_as_a_box:
            w, h = size
            boxes = torch.cat([torch.tensor([[0.0, 0.0, w - 1.0, h - 1.0, 1.0, 0.0]]), boxes])
            masks = torch.cat([torch.ones(1, *self.mask_size), masks])
        return boxes, masks

    def _recorded_size(self, meta, ann):
        """``((width, height) or None, where)``: the image size the metadata gives and the words naming it."""
        recorded = (meta["width"], meta["height"]) if "width" in meta and "height" in meta else None
        return recorded, "{} (for {} line {})".format(ann["metadata_fn"], self.ann_file, ann["line"])

    def _texts_and_objects(self, ann):
        """``(texts, kept object indices)``: the question, answers (and rationales) and the objects they keep."""
        texts = [ann["question"]] + ann["answer_choices"] + (ann["rationale_choices"] if self.task != "Q2A" else [])
        if self.only_use_relevant_dets:
            keep, texts = keep_only_relevant(texts)
            return texts, keep
        return texts, list(range(len(ann["objects"])))

    def item_source(self, index):
        """``(file, line)`` where item ``index`` is defined: the annotation file and its 1-based line."""
        return self.ann_file, self.annotations[index]["line"]

    def check_item(self, index):
        """Read item ``index`` as :meth:`__getitem__` does, the image only to its header (size, EXIF
        orientation): the metadata, its boxes against the image size, every text through the tokenizer.

        Raises:
            VCRDataError / FileNotFoundError / ValueError: as :meth:`__getitem__`; a box beyond the image.
        """
        ann = self.annotations[index]
        meta = self._load(load_json, ann["metadata_fn"], ann)
        size = self._load(lambda path: image_size(path, *self._recorded_size(meta, ann)), ann["img_fn"], ann)
        texts, keep = self._texts_and_objects(ann)
        boxes, _ = self._boxes_and_masks(meta, ann["objects"], keep, ann, size)
        objects = boxes[1:] if self.add_image_as_a_box else boxes  # (the whole-image box is inside)
        check_boxes_inside(ann["img_fn"], size, objects, self._recorded_size(meta, ann)[1], error=VCRDataError,
                           ids=keep)
        names = self._names([ann["objects"][o] for o in keep])
        for text in texts:
            self._tokenize(text, names, 0 if self.add_image_as_a_box else -1)

    def __getitem__(self, key):
        index, generator = resolve_key(key)
        ann = self.annotations[index]
        meta = self._load(load_json, ann["metadata_fn"], ann)
        image = self._load(lambda path: load_image(path, *self._recorded_size(meta, ann)), ann["img_fn"], ann)
        return self.item(ann, meta, image, index, generator)

    def item(self, ann, meta, image, index, generator=None):
        """The item's tuple (``data_names`` order) of one annotation, its image's metadata and image (what
        ``dataset[i]`` returns; the predictor, ``vcr/predict.py``, builds its items here too).

        Args:
            ann: an entry of ``annotations`` (the jsonl line's fields; ``img_fn`` / ``metadata_fn`` and ``line``
                name it in errors).
            meta: the metadata dict (``boxes``, optional ``segms``, ``width`` / ``height``).
            image: RGB ``PIL.Image``. index: stored in ``im_info[4]``. generator: of the random transforms.
        Raises:
            VCRDataError: boxes or polygons that do not fit the objects (names the files).
        """
        use_rationales = self.task != "Q2A"
        objects = ann["objects"]
        texts, keep = self._texts_and_objects(ann)
        boxes, masks = self._boxes_and_masks(meta, objects, keep, ann, image.size)
        names = self._names([objects[o] for o in keep])

        w0, h0 = image.size
        sample = {"image": image, "boxes": boxes, "masks": masks,
                  "im_info": torch.tensor([w0, h0, 1.0, 1.0, index], dtype=torch.float32), "texts": texts,
                  "generator": generator}
        if self.transform is not None:
            sample = self.transform(sample)
        clip_boxes_(sample["boxes"], sample["im_info"][0].item(), sample["im_info"][1].item())

        word_tag = 0 if self.add_image_as_a_box else -1
        rows = [self._tokenize(t, names, word_tag) for t in sample["texts"]]
        question, answers = rows[0], rows[1:1 + NUM_CHOICES]
        rationales = rows[1 + NUM_CHOICES:]
        text_fields = self._text_fields(question, answers, rationales, ann)
        out = dict(text_fields, image=sample["image"], boxes=sample["boxes"], masks=sample["masks"],
                   im_info=sample["im_info"])
        if not self.test_mode:
            out["answer_label"] = torch.tensor(ann["answer_label"])
            if use_rationales:
                out["rationale_label"] = torch.tensor(ann["rationale_label"])
        return tuple(out[name] for name in self.data_names)

    # ------------------------------------------------------------------ text layout
    def _truncate_pairs(self, query, responses):
        """Shorten ``query`` (in place, shared) and each response until query + response
        <= seq_len, popping from the longer one (the reference's Q2A rule)."""
        for r in responses:
            while len(query) + len(r) > self.seq_len:
                (r if len(r) > len(query) else query).pop()

    def _truncate_query_pairs(self, question, answer, rationales):
        """QA2R rule: pop from the rationale while it is longer than the query, else from the
        question (keeping one word piece), else from the answer."""
        q_len = (lambda: 0) if self.qa2r_noq else (lambda: len(question))
        for r in rationales:
            while q_len() + len(answer) + len(r) > self.seq_len:
                if len(r) > q_len() + len(answer):
                    r.pop()
                elif q_len() > 1:
                    question.pop()
                else:
                    answer.pop()

    def _text_fields(self, question, answers, rationales, ann):
        fields = {}
        if self.task in ("Q2A", "Q2AR"):
            self._truncate_pairs(question, answers)
        if self.task in ("QA2R", "Q2AR"):
            if self.test_mode:
                anchor = max(answers, key=len)
            else:
                anchor = answers[ann["answer_label"]]
            self._truncate_query_pairs(question, anchor, rationales)
            if self.test_mode:
                # truncation may have shortened the anchor: cut the other answers to its length
                for a in answers:
                    del a[len(anchor):]
        q, qm = _as_rows(question)
        a_rows = [_as_rows(a) for a in answers]
        if self.task == "QA2R":
            def query(a, am):
                if self.qa2r_noq:
                    return a, am
                return torch.cat([q, a]), torch.block_diag(qm, am)

            if self.test_mode:
                pairs = [query(*ar) for ar in a_rows]
                fields["question"] = [p[0] for p in pairs]
                fields["question_align_matrix"] = [p[1] for p in pairs]
            else:
                fields["question"], fields["question_align_matrix"] = query(*a_rows[ann["answer_label"]])
        else:
            fields["question"], fields["question_align_matrix"] = q, qm
            fields["answer_choices"] = [r for r, _ in a_rows]
            fields["answer_align_matrix"] = [m for _, m in a_rows]
        if self.task != "Q2A":
            r_rows = [_as_rows(r) for r in rationales]
            fields["rationale_choices"] = [r for r, _ in r_rows]
            fields["rationale_align_matrix"] = [m for _, m in r_rows]
        return fields


def check_data_paths(data_path, splits, storage):
    """Raise one FileNotFoundError listing everything missing for ``splits``.

    Args:
        data_path (str): ``DATASET.DATASET_PATH``.
        splits (list of (annotation file, image set)): as named in the config.
        storage (str): 'folder', 'zip' (image sets are ``{image_set}.zip`` archives) or 'lmdb'
            (``{image_set}.lmdb`` stores).
    """
    if not os.path.isdir(data_path):
        missing = ["DATASET.DATASET_PATH '{}' (folder)".format(data_path)]
    else:
        missing = []
        for ann_file, image_set in splits:
            ann = os.path.join(data_path, ann_file)
            images = container(stored_folder(os.path.join(data_path, image_set), storage))
            for path, ok in ((ann, os.path.isfile(ann)), (images, os.path.exists(images))):
                if not ok and path not in missing:
                    missing.append(path)
    if missing:
        raise FileNotFoundError("VCR data not found: missing {}. See {} for how to get and lay out VCR.".format(
            ", ".join(missing), PREPARE_DOC))


def _as_rows(rows):
    """(L, 3) int64 tensor of ``[id, tag, align]`` rows and its align matrix."""
    t = torch.tensor(rows, dtype=torch.int64).view(-1, 3)
    return t, align_matrix(t[:, 2].tolist())
