"""The VQA predictor: an image and a question -> the top answers of the checkpoint's vocabulary, and the boxes used.

Items are built by the data set's own code (:class:`vqa.data.vqa.VQAItems`); the boxes of a raw photo come
from a box source (:class:`common.data.box_sources.BoxSource`), and a model trained on precomputed region
features (``NETWORK.IMAGE_FEAT_PRECOMPUTED``, the VQA demo) gets them from the image encoder that made them
(:mod:`common.modeling.region_extractor`, what ``tools/extract_features.py`` runs).
"""
import re

import numpy as np
import torch

from common.checkpoint.run_files import read_run_info
from common.data.region_features import RegionFeatures
from common.data.tokenizer import build_tokenizer
from common.data.transforms import build_transforms
from common.errors import UserInputError
from common.inference.inputs import top_predictions
from common.inference.predictor import TaskPredictor, load_feature_extractor, recorded_box_source
from common.modeling.region_extractor import extract_regions
from vqa.data.answers import AnswerVocab
from vqa.data.vqa import VQADataset, VQAItems

def check_answers(vocab, info, ckpt_path, vocab_file):
    """UserInputError when the run's recorded answers (``predictor.json``) are not the config's answer file's."""
    recorded = info.get("answers")
    if recorded is not None and list(recorded) != list(vocab.answers):
        differ = next((i for i, (a, b) in enumerate(zip(recorded, vocab.answers)) if a != b),
                      min(len(recorded), len(vocab.answers)))
        raise UserInputError("DATASET.ANSWER_VOCAB_FILE {}: its {} answers are not the {} the checkpoint {} was "
                             "trained on (they differ first at line {}); give the answer file of the training "
                             "run".format(
                                 vocab_file, len(vocab), len(recorded), ckpt_path, differ + 1))


def check_classifier(ckpt, cfg, source):
    """UserInputError when the checkpoint's answer classifier (its last ``final_mlp`` layer) has another number
    of answers than DATASET.ANSWER_VOCAB_SIZE."""
    layers = {}
    for key, value in ckpt["state_dict"].items():
        match = re.fullmatch(r"(?:module\.)?final_mlp\.(\d+)\.weight", key)
        if match and value.dim() == 2:
            layers[int(match.group(1))] = value.shape[0]
    if layers and layers[max(layers)] != cfg.DATASET.ANSWER_VOCAB_SIZE:
        raise UserInputError("{}: its classifier has {} answers, but the config's DATASET.ANSWER_VOCAB_SIZE is {} "
                             "(ANSWER_VOCAB_FILE {}); give the answer file of the training run".format(
                                 source, layers[max(layers)], cfg.DATASET.ANSWER_VOCAB_SIZE,
                                 cfg.DATASET.ANSWER_VOCAB_FILE))


class VQAPredictor(TaskPredictor):
    """Input ``{"image", "question", "boxes" (optional)}``; output ``predictions`` over the answer vocabulary
    (score: the sigmoid of the logit for ``NETWORK.ANS_LOSS_TYPE`` 'bce', the softmax for 'ce', as trained) and
    ``boxes`` (the regions used, pixels of the image, the whole image first when ``DATASET.ADD_IMAGE_AS_A_BOX``)."""
    fields = {"question": True, "boxes": False}
    dataset_class = VQADataset

    def __init__(self, task, cfg, ckpt, ckpt_path, device, feature_weights=None, box_source=None):
        super().__init__(cfg, device, box_source)
        check_classifier(ckpt, cfg, ckpt_path)
        self.vocab = AnswerVocab.from_file(cfg.DATASET.ANSWER_VOCAB_FILE)
        check_answers(self.vocab, read_run_info(ckpt_path), ckpt_path, cfg.DATASET.ANSWER_VOCAB_FILE)
        self.precomputed = cfg.NETWORK.IMAGE_FEAT_PRECOMPUTED
        self.items = VQAItems(build_tokenizer(cfg.NETWORK.BERT_MODEL_NAME), self.vocab, build_transforms(cfg, "test"),
                              test_mode=True, precomputed=self.precomputed,
                              add_image_as_a_box=cfg.DATASET.ADD_IMAGE_AS_A_BOX)
        recorded = None
        if self.precomputed:
            self.extractor, self.extractor_transform, recorded = load_feature_extractor(task, cfg, ckpt_path,
                                                                                  feature_weights, device)
        if box_source is None and recorded:  # the box source of the training features
            self.box_source = recorded_box_source(recorded, device)

    @property
    def data_names(self):
        return self.items.data_names

    def item(self, image, inputs, index, name):
        boxes = self.boxes_of(inputs, image, name)
        w, h = image.size
        if self.precomputed:
            features, image_box = extract_regions(self.extractor, self.extractor_transform, [image], [boxes],
                                                  self.device)[0]
        else:  # end to end: the model pools its own features
            features, image_box = np.zeros((len(boxes), 0), np.float32), None
        regions = RegionFeatures(name, w, h, boxes.numpy(), features, image_box)
        item = self.items(inputs["question"], None, regions, None if self.precomputed else image, index)
        used = item[self.items.data_names.index("boxes")][:, :4]
        return item, {"boxes": used.tolist()}

    def scores(self, logits):
        """Answer scores of logits float ``[B, A]`` as the model was trained (sigmoid or softmax)."""
        if self.cfg.NETWORK.ANS_LOSS_TYPE == "ce":
            return torch.softmax(logits.float(), 1)
        return torch.sigmoid(logits.float())

    def decode(self, outputs, contexts, topk):
        scores = self.scores(outputs["label_logits"])
        return [dict(context, predictions=top_predictions(row, self.vocab.answers, topk))
                for row, context in zip(scores, contexts)]
