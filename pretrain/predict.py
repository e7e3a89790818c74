"""The pretraining predictor: an image and a caption with ``[MASK]`` words -> the top word pieces at each ``[MASK]``
(masked language modelling with visual clues, the paper's Sec. 3.2 task).

Items are built by the caption data set's own code (:meth:`pretrain.data.caption_dataset.
ConceptualCaptionsDataset.item`, nothing masked at random: the ``[MASK]`` words are the caption's); the regions of
a photo come from the box source (a grid by default), their features from the image encoder that made the
training features when the model reads precomputed ones (:func:`common.inference.predictor.load_feature_extractor`).
With a
``DATASET`` list the first entry (the image-caption set) gives the item keys; the text-only corpora get no sample.
"""
import re

import torch

from common.data.box_sources import BoxSource
from common.data.multitask import dataset_configs
from common.data.transforms import build_transforms
from common.errors import UserInputError
from common.inference.inputs import top_predictions
from common.inference.predictor import TaskPredictor, load_feature_extractor
from common.modeling.region_extractor import extract_regions
from pretrain.data.caption_dataset import ConceptualCaptionsDataset
from pretrain.data.conceptual_captions import Detections

MASK = "[MASK]"


class PretrainPredictor(TaskPredictor):
    """Input ``{"image", "caption" (with one or more ``[MASK]`` words), "boxes" (optional)}``; output ``masks``:
    one list per ``[MASK]`` (in caption order) of the top word pieces by softmax probability, and ``filled``,
    the caption with each ``[MASK]`` replaced by its best word piece."""
    fields = {"caption": True, "boxes": False}
    dataset_class = ConceptualCaptionsDataset

    def __init__(self, task, cfg, ckpt_path, device, feature_weights=None, box_source=None):
        super().__init__(cfg, device, box_source)
        self.item_cfg = dataset_configs(cfg)[0] if isinstance(cfg.DATASET, list) else cfg
        self.num_corpora = len(cfg.DATASET) - 1 if isinstance(cfg.DATASET, list) else 0
        self.dataset = ConceptualCaptionsDataset.for_items(self.item_cfg, build_transforms(self.item_cfg, "test"))
        self.tokenizer = self.dataset.masker.tokenizer
        self.mask_id = self.tokenizer.convert_tokens_to_ids([MASK])[0]
        self.vocab = [t for t, _ in sorted(self.tokenizer.vocab.items(), key=lambda kv: kv[1])]
        self.precomputed = cfg.NETWORK.IMAGE_FEAT_PRECOMPUTED
        if self.precomputed:
            self.extractor, self.extractor_transform, recorded = load_feature_extractor(
                task, cfg, ckpt_path, feature_weights, device)
            if box_source is None and recorded:
                self.box_source = BoxSource(device=device, **recorded)

    @property
    def data_names(self):
        return list(ConceptualCaptionsDataset.data_names)

    def item(self, image, inputs, index, name):
        words = self.dataset.masker.words(re.sub(re.escape(MASK), " {} ".format(MASK), inputs["caption"]))
        if MASK not in words:
            raise UserInputError("{}: the caption has no {} word to fill in: {!r}".format(
                name, MASK, inputs["caption"]))
        boxes = self.boxes_of(inputs, image, name)
        w, h = image.size
        features = None
        if self.precomputed:
            features = torch.from_numpy(extract_regions(self.extractor, self.extractor_transform, [image], [boxes],
                                                        self.device)[0][0])
        det = Detections(boxes, None, features, w, h)
        item = list(self.dataset.item(index, None if self.precomputed else image, det, words))
        text = item[self.data_names.index("text")]
        masked = (text == self.mask_id).nonzero().flatten()
        if len(masked) == 0:
            raise UserInputError("{}: every {} was cut: the caption and the regions exceed DATASET.SEQ_LEN {}".format(
                name, MASK, self.item_cfg.DATASET.SEQ_LEN))
        labels = item[self.data_names.index("mlm_labels")].clone()
        labels[masked] = self.mask_id  # the positions the MLM head is read at (a label makes them count)
        item[self.data_names.index("mlm_labels")] = labels
        return tuple(item), {"_masked": masked.tolist(), "_words": words}

    def forward(self, model, inputs):
        # A DATASET list's model takes a (text, labels) pair per text corpus after the image-caption batch: none.
        empty = inputs[1].new_zeros((0, 1), dtype=torch.long)
        return model(*inputs, *[empty, empty - 1] * self.num_corpora)

    def decode(self, outputs, contexts, topk):
        logits = outputs["mlm_logits_wvc"] if "mlm_logits_wvc" in outputs else outputs["mlm_logits"]
        results = []
        for row, context in zip(logits.float(), contexts):
            masks = [top_predictions(torch.softmax(row[p], 0), self.vocab, topk) for p in context["_masked"]]
            best = iter(m[0]["label"] for m in masks)
            filled = " ".join(next(best, MASK) if w == MASK else w for w in context["_words"])
            results.append(dict(context, masks=masks, filled=filled.replace(" ##", "")))
        return results
