"""VQA v2 (Goyal et al., CVPR 2017) data set in the official file format, for VL-BERT (paper Sec. 4.3).

One item per question: the text ``[CLS] question [SEP] [MASK] [SEP]`` is laid out by the model from
the question's word pieces; the image is the whole-image box plus the precomputed regions of the
question's image; the target is the soft score of every vocabulary answer (``data/PREPARE_DATA.md``
describes every file). Splits are named as in the reference and joined with ``+``
(``'train2014+val2014'``).
"""
import os

import torch
from torch.utils.data import Dataset

from common.data.build import register_dataset
from common.data.collate import index_from_im_info
from common.data.feature_cache import FeatureCache, FeatureCacheError
from common.data.loading import check_image_size, load_image
from common.data.region_features import FeatureFileError, feature_json_path, read_feature_json
from common.data.samplers import resolve_key
from common.data.storage import container_exists, stored_folder, storage_of
from common.data.tokenizer import build_tokenizer
from common.data.transforms import clip_boxes_
from common.errors import UserInputError

from .answers import AnswerVocab
from .vqa_files import check_same_split, load_annotations, load_questions

__all__ = ["SPLITS", "VQADataError", "VQADataset", "VQAItems"]

PREPARE_DOC = "data/PREPARE_DATA.md"
# COCO image folder of each split (minival2014 / valminusminival2014: tools/split_vqa_val.py).
SPLITS = {"train2014": "train2014", "val2014": "val2014", "minival2014": "val2014",
          "valminusminival2014": "val2014", "test-dev2015": "test2015", "test2015": "test2015"}
QUESTION_FILE = "vqa/v2_OpenEnded_mscoco_{}_questions.json"
ANNOTATION_FILE = "vqa/v2_mscoco_{}_annotations.json"
PRECOMPUTED_ROOT = "vgbua_res101_precomputed"
# Feature folders of DATASET.BOXES, for (train2014 / val2014 images, test2015 images).
FEATURE_FOLDERS = {"36": ("trainval_resnet101_faster_rcnn_genome_36", "test2015_resnet101_faster_rcnn_genome_36"),
                   "10-100ada": ("trainval2014_resnet101_faster_rcnn_genome", "test2015_resnet101_faster_rcnn_genome")}
CACHE_SUFFIX = ".cache"
# Width of the released bottom-up-attention features (checked in IMAGE_FEAT_PRECOMPUTED mode).
FEATURE_DIM = 2048


class VQADataError(UserInputError):
    """Bad or missing VQA data; the message names the file and the question id."""


def split_files(data_path, split, boxes, storage, test_mode):
    """Paths of one split: ``(questions, annotations or None, feature folder, cache folder, image pattern)``.

    The feature and image folders are ``archive.zip@/folder`` in 'zip' storage, ``store.lmdb@/folder`` in
    'lmdb' storage (``common.data.storage.stored_folder``); the cache folder is the feature folder
    plus ``.cache`` (used when it exists); the image pattern takes ``image_id`` (``{:012d}``).
    """
    coco = SPLITS[split]
    folder = FEATURE_FOLDERS[boxes][coco == "test2015"]
    features = stored_folder(os.path.join(data_path, PRECOMPUTED_ROOT, folder), storage)
    images = stored_folder(os.path.join(data_path, coco), storage)
    return (os.path.join(data_path, QUESTION_FILE.format(split)),
            None if test_mode else os.path.join(data_path, ANNOTATION_FILE.format(split)),
            features, os.path.join(data_path, PRECOMPUTED_ROOT, folder + CACHE_SUFFIX),
            os.path.join(images, "COCO_{}_{{:012d}}.jpg".format(coco)))


class VQADataset(Dataset):
    """VQA questions as tensors, in the order of ``data_names``.

    Batches pad ``boxes`` with -2 (``pad_values``, the reference's VQA value): the VQA model keeps
    rows whose first coordinate is above -1.5 (:func:`vqa.modules.resnet_vlbert_for_vqa.box_mask`).

    Args:
        image_set: split names joined by ``+`` (keys of ``SPLITS``: ``train2014``, ``val2014``,
            ``minival2014``, ``valminusminival2014``, ``test-dev2015``, ``test2015``).
        data_path: ``DATASET.DATASET_PATH`` (``./data/coco``).
        answer_vocab_file: ``DATASET.ANSWER_VOCAB_FILE``.
        tokenizer: ``BertTokenizer``.
        transform: image transform (``common.data.transforms``), used end to end only.
        test_mode: no annotations are read and no label is returned.
        storage: 'folder', 'zip' or 'lmdb': features and images from folders, ``<folder>.zip`` archives or
            ``<folder>.lmdb`` stores.
        with_precomputed_visual_feat: ``NETWORK.IMAGE_FEAT_PRECOMPUTED``.
        boxes: ``DATASET.BOXES``, ``"36"`` or ``"10-100ada"`` (which feature folders to read).
        add_image_as_a_box: box 0 is the whole image.
        answer_vocab_size: expected number of answers (``DATASET.ANSWER_VOCAB_SIZE``), or None.

    Items (``data_names`` order): ``image`` float ``(3, H, W)`` end to end, None with precomputed
    features; ``boxes`` float ``(K, 4)`` ``x1, y1, x2, y2`` pixels, or ``(K, 4 + 2048)`` with the
    features appended (precomputed); ``im_info`` float ``(5,)`` = ``width, height, scale_x,
    scale_y, index``; ``question`` int64 ``(Lq,)`` word-piece ids; ``label`` float ``(A,)`` soft
    scores over the answer vocabulary (not in test mode). The whole-image box has the file's
    ``image_box_feature``, or the mean of the region features as in the reference.

    Boxes come from the split's feature folder in both modes, or from its cache
    (``<folder>.cache``, ``tools/build_feature_cache.py``) when that exists. With precomputed
    features no transform is applied: the features do not flip, and boxes stay in pixels of the
    original image (the model embeds box positions relative to the image size, so the reference's
    resize of precomputed boxes changes nothing). End to end, a flip from ``transform`` swaps
    left and right in the question and in the annotators' answers, so the target stays right.

    ``dataset[key]`` takes an int or a ``SampleKey`` (random transforms draw from its generator).

    Raises:
        FileNotFoundError: one message listing every missing file or folder of the splits.
        VQADataError: unknown split or BOXES, annotations for a test split; per item: no feature file
            for the question's image, a malformed feature file (names the file, question and image
            id), an image whose decoded (EXIF-rotated) size is not the features' ``image_w`` /
            ``image_h`` with a box beyond it.
    Warns:
        common.data.loading.ImageSizeWarning: end to end, decoded size unlike the features', boxes within it.
        VqaFileError / AnswerVocabError: malformed question, annotation or answer files, question
            and annotation files of different splits, or an answer file that is not
            ``answer_vocab_size`` long.
    """

    # Read by common.data.build.make_dataloader: each batch's dataset indices by name (batch.field("index")).
    batch_extras = {"index": index_from_im_info}

    # Read by common.data.build.make_dataloader: -1 would pass the model's box mask (> -1.5).
    pad_values = {"boxes": -2.0}

    def __init__(self, image_set, data_path, answer_vocab_file, tokenizer, transform=None, test_mode=False,
                 storage="folder", with_precomputed_visual_feat=True, boxes="36", add_image_as_a_box=True,
                 answer_vocab_size=None):
        splits = [s.strip() for s in image_set.split("+")]
        unknown = [s for s in splits if s not in SPLITS]
        if unknown:
            raise VQADataError("unknown VQA split(s) {} in '{}'; known: {}".format(
                unknown, image_set, ", ".join(SPLITS)))
        if boxes not in FEATURE_FOLDERS:
            raise VQADataError("DATASET.BOXES must be one of {}, got {!r}".format(list(FEATURE_FOLDERS), boxes))
        if not test_mode and any(SPLITS[s] == "test2015" for s in splits):
            raise VQADataError("'{}' has no annotations: test splits are for test mode only".format(image_set))
        self.tokenizer = tokenizer
        self.transform = transform
        self.test_mode = test_mode
        self.precomputed = with_precomputed_visual_feat
        self.add_image_as_a_box = add_image_as_a_box
        self.files = [split_files(data_path, s, boxes, storage, test_mode) for s in splits]
        self._check_paths(answer_vocab_file)
        self.answer_vocab = AnswerVocab.from_file(answer_vocab_file)
        if answer_vocab_size is not None:
            self.answer_vocab.check_size(answer_vocab_size)
        self.database = self._load_questions()
        self.items = VQAItems(tokenizer, self.answer_vocab, transform, test_mode, with_precomputed_visual_feat,
                              add_image_as_a_box)
        self._caches = [FeatureCache(f[3]) if os.path.isdir(f[3]) else None for f in self.files]
        for cache in self._caches:
            if self.precomputed and cache is not None and len(cache) and cache.feature_dim != FEATURE_DIM:
                raise VQADataError("{}: features of width {}, IMAGE_FEAT_PRECOMPUTED needs {}".format(
                    cache.path, cache.feature_dim, FEATURE_DIM))

    @classmethod
    def from_config(cls, cfg, mode, transform=None):
        """Data set of ``mode`` ('train' / 'val' / 'test') from the reference's config keys."""
        d = cfg.DATASET
        if d.USE_IMDB:
            raise VQADataError("DATASET.USE_IMDB: true reads Pythia's imdb .npy files, which are not supported; "
                               "set it to false to read the official question and annotation files (as the "
                               "paper configs do)")
        if d.CACHE_MODE:
            raise VQADataError("DATASET.CACHE_MODE is not supported (the reference does not implement it either); "
                               "see the feature cache in {}".format(PREPARE_DOC))
        return cls(d["{}_IMAGE_SET".format(mode.upper())], d.DATASET_PATH, d.ANSWER_VOCAB_FILE,
                   build_tokenizer(cfg.NETWORK.BERT_MODEL_NAME), transform=transform, test_mode=mode == "test",
                   storage=storage_of(d), with_precomputed_visual_feat=cfg.NETWORK.IMAGE_FEAT_PRECOMPUTED,
                   boxes=d.BOXES, add_image_as_a_box=d.ADD_IMAGE_AS_A_BOX, answer_vocab_size=d.ANSWER_VOCAB_SIZE)

    def _check_paths(self, answer_vocab_file):
        needed = [answer_vocab_file]
        for questions, annotations, features, cache, images in self.files:
            needed += [questions] + ([annotations] if annotations else [])
            needed += [] if os.path.isdir(cache) else [features]
            needed += [] if self.precomputed else [os.path.dirname(images)]
        missing = list(dict.fromkeys(p for p in needed if not container_exists(p)))
        if missing:
            raise FileNotFoundError("VQA data missing (DATASET.DATASET_PATH, ANSWER_VOCAB_FILE, BOXES): {}; see {}"
                                    .format(", ".join(missing), PREPARE_DOC))

    def _load_questions(self):
        database = []
        for split_index, (q_path, a_path, _, _, _) in enumerate(self.files):
            questions = load_questions(q_path)
            answers = {}
            if a_path is not None:
                annotations = load_annotations(a_path)
                check_same_split(questions, annotations, q_path, a_path)
                answers = {a["question_id"]: [x["answer"] for x in a["answers"]] for a in annotations}
            database += [{"question_id": q["question_id"], "image_id": q["image_id"], "question": q["question"],
                          "answers": answers.get(q["question_id"]), "split": split_index, "position": k}
                         for k, q in enumerate(questions)]
        return database

    def item_source(self, index):
        """``(question file, {'index': n})``: item ``index`` is entry n (from 0) of the file's ``questions`` list."""
        q = self.database[index]
        return self.files[q["split"]][0], {"index": q["position"]}

    def __len__(self):
        return len(self.database)

    @property
    def question_ids(self):
        """``question_id`` of every item, in index order (for result files)."""
        return [q["question_id"] for q in self.database]

    @property
    def annotation_files(self):
        """Annotation file of each split of the image set (None in test mode), in ``+`` order."""
        return [f[1] for f in self.files]

    @property
    def data_names(self):
        """Names of the item's fields, in order (the reference's)."""
        return self.items.data_names

    def _regions(self, q):
        where = "question_id {} (image_id {})".format(q["question_id"], q["image_id"])
        cache = self._caches[q["split"]]
        path = feature_json_path(self.files[q["split"]][2], q["image_id"])
        try:
            if cache is not None:
                return cache[q["image_id"]]
            return read_feature_json(path, FEATURE_DIM if self.precomputed else None)
        except FileNotFoundError:
            raise VQADataError("{}: no feature file {}; see {}".format(where, path, PREPARE_DOC)) from None
        except (FeatureFileError, FeatureCacheError) as e:
            raise VQADataError("{}: {}".format(where, e)) from None

    def __getitem__(self, key):
        index, generator = resolve_key(key)
        q = self.database[index]
        regions = self._regions(q)
        image = None
        if not self.precomputed:
            path = self.files[q["split"]][4].format(q["image_id"])
            recorded = ((regions.image_w, regions.image_h),
                        "the regions of question_id {} (image_id {})".format(q["question_id"], q["image_id"]))
            try:
                image = load_image(path, *recorded)
            except (FileNotFoundError, UserInputError) as e:
                raise VQADataError("question_id {}: {}".format(q["question_id"], e)) from None
            check_image_size(path, image.size, *recorded, torch.from_numpy(regions.boxes), error=VQADataError)
        return self.items(q["question"], q["answers"], regions, image, index, generator)


class VQAItems:
    """One VQA item from its parts, as :class:`VQADataset` returns it (the data set and the predictor,
    ``vqa/predict.py``, both build items here).

    Args:
        tokenizer: ``BertTokenizer``.
        answer_vocab: :class:`vqa.data.answers.AnswerVocab` (the soft target's order).
        transform: image transform (``common.data.transforms``), used end to end only.
        test_mode: no label.
        precomputed: ``NETWORK.IMAGE_FEAT_PRECOMPUTED``: the features go after the box columns, no image.
        add_image_as_a_box: box 0 is the whole image.
    """

    def __init__(self, tokenizer, answer_vocab, transform=None, test_mode=False, precomputed=True,
                 add_image_as_a_box=True):
        self.tokenizer = tokenizer
        self.answer_vocab = answer_vocab
        self.transform = transform
        self.test_mode = test_mode
        self.precomputed = precomputed
        self.add_image_as_a_box = add_image_as_a_box

    @property
    def data_names(self):
        """Names of the item's fields, in order (the reference's)."""
        return ["image", "boxes", "im_info", "question"] + ([] if self.test_mode else ["label"])

    def __call__(self, question, answers, regions, image, index, generator=None):
        """The item's tuple in :attr:`data_names` order (see :class:`VQADataset`).

        Args:
            question: the question text.
            answers: the annotators' answers (None in test mode).
            regions: :class:`common.data.region_features.RegionFeatures` of the image (features unused end to end).
            image: ``PIL.Image`` end to end (of ``regions``' size), None with precomputed features.
            index: dataset index, stored in ``im_info[4]``.
            generator: ``torch.Generator`` of the random transforms, or None.
        """
        boxes = torch.from_numpy(regions.boxes)
        features = torch.from_numpy(regions.features)
        w, h = (regions.image_w, regions.image_h) if image is None else image.size
        if self.add_image_as_a_box:
            boxes = torch.cat((torch.tensor([[0.0, 0.0, w - 1.0, h - 1.0]]), boxes))
            if regions.image_box_feature is not None:
                image_box = torch.from_numpy(regions.image_box_feature)[None]
            else:
                image_box = features.mean(0, keepdim=True) if len(features) else features.new_zeros(1, FEATURE_DIM)
            features = torch.cat((image_box, features))

        texts = [[question]] + [[a] for a in answers or []]
        sample = {"image": image, "boxes": boxes, "im_info": torch.tensor([w, h, 1.0, 1.0, index]),
                  "texts": texts, "generator": generator}
        if image is not None and self.transform is not None:
            sample = self.transform(sample)
        clip_boxes_(sample["boxes"], sample["im_info"][0].item(), sample["im_info"][1].item())
        question, answers = sample["texts"][0][0], [t[0] for t in sample["texts"][1:]]

        out = {"image": sample["image"], "im_info": sample["im_info"],
               "boxes": torch.cat((sample["boxes"], features), 1) if self.precomputed else sample["boxes"],
               "question": torch.tensor(self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize(question)),
                                        dtype=torch.int64)}
        if not self.test_mode:
            out["label"] = torch.from_numpy(self.answer_vocab.soft_target(answers))
        return tuple(out[name] for name in self.data_names)


register_dataset("vqa", VQADataset)
