"""RefCOCO+ config (reference ``refcoco/function/config.py``).

The data set (``refcoco.data``), the model (``refcoco.modules``) and the metrics (``refcoco.metrics``) read
these keys; ``KEY_STATUS`` says what each key does here (see :mod:`common.config.keys`).
"""
from common.config import common_defaults, reference_api, task_rules
from common.config.keys import DONE, key_checker, refused, task_key_status, warned
from common.config.values import PROBABILITY
from common.modeling.vlbert_config import (VISUAL_SCALE_RULES, VISUAL_SCALE_STATUS, VLBERT_RULES, VLBERT_STATUS,
                                           add_answer_vocab_config, add_visual_scale_config, add_vlbert_config)


def refcoco_defaults():
    """Defaults of the RefCOCO+ task as a fresh mutable CfgNode."""
    _C = add_answer_vocab_config(add_visual_scale_config(add_vlbert_config(common_defaults())))
    # Boxes of each split: "gt" (ground truth) or "proposal" (detections).
    _C.DATASET.TRAIN_BOXES = "gt"
    _C.DATASET.VAL_BOXES = "gt"
    _C.DATASET.TEST_BOXES = "gt"
    # Detections of "proposal" boxes: "official" (MAttNet) or "vg".
    _C.DATASET.PROPOSAL_SOURCE = 'official'
    del _C.NETWORK['FOR_MASK_VL_MODELING_PRETRAIN']
    _C.NETWORK.ENABLE_CNN_REG_LOSS = False
    _C.TRAIN.LOSS_LOGGERS = [('cls_loss', 'ClsLoss')]
    return _C


# Valid values of the numeric keys that RefCOCO+'s model reads (common.config.values).
VALUE_RULES = task_rules({"NETWORK.CLASSIFIER_DROPOUT": PROBABILITY}, (VLBERT_RULES, VISUAL_SCALE_RULES))

# The reference's module API (load a config for a run with the Task's load_config).
config, update_config = reference_api(refcoco_defaults, VALUE_RULES)

_NOT_READ = "the RefCOCO+ data set and model do not read it (the reference's neither)"
_VQA_KEY = "a VQA answer-vocabulary key; RefCOCO+ has no answer vocabulary (the reference's neither)"

# Keys of the VL-BERT group that RefCOCO+ reads, ignores or refuses, and RefCOCO+'s own keys.
KEY_STATUS = task_key_status(refcoco_defaults(), {
    "DATASET.APPEND_INDEX": refused("the RefCOCO+ model takes no sample-index input (im_info carries the index)"),
    "DATASET.TASK": warned("RefCOCO+ has one task; " + _NOT_READ),
    "DATASET.BASIC_ALIGN": warned(_NOT_READ),
    "DATASET.DATASET_PATH": DONE,
    "DATASET.TRAIN_IMAGE_SET": DONE,
    "DATASET.VAL_IMAGE_SET": DONE,
    "DATASET.TEST_IMAGE_SET": DONE,
    "DATASET.TRAIN_ANNOTATION_FILE": warned("the annotations are refcoco+/refs(unc).p and instances.json; "
                                            + _NOT_READ),
    "DATASET.VAL_ANNOTATION_FILE": warned("the annotations are refcoco+/refs(unc).p and instances.json; "
                                          + _NOT_READ),
    "DATASET.TEST_ANNOTATION_FILE": warned("the annotations are refcoco+/refs(unc).p and instances.json; "
                                           + _NOT_READ),
    "DATASET.ONLY_USE_RELEVANT_DETS": warned("the candidates are DATASET.*_BOXES; " + _NOT_READ),
    "DATASET.ADD_IMAGE_AS_A_BOX": DONE,
    "DATASET.ZIP_MODE": DONE,
    "DATASET.CACHE_MODE": refused("not implemented (the reference's RefCOCO+ data set neither)"),
    "DATASET.MASK_SIZE": warned("RefCOCO+ boxes have no masks; " + _NOT_READ),
    "DATASET.QA2R_NOQ": warned("a VCR key; " + _NOT_READ),
    "DATASET.QA2R_AUG": warned("a VCR key; " + _NOT_READ),
    "DATASET.ANSWER_VOCAB_FILE": warned(_VQA_KEY),
    "DATASET.ANSWER_VOCAB_SIZE": warned(_VQA_KEY),
    "DATASET.USE_IMDB": warned(_VQA_KEY),
    "DATASET.TRAIN_BOXES": DONE,
    "DATASET.VAL_BOXES": DONE,
    "DATASET.TEST_BOXES": DONE,
    "DATASET.PROPOSAL_SOURCE": DONE,
    "NETWORK.BLIND": DONE,
    "NETWORK.NO_GROUNDING": warned("every word already carries the whole-image feature, not a box's; " + _NOT_READ),
    "NETWORK.NO_OBJ_ATTENTION": warned(_NOT_READ),
    "NETWORK.IMAGE_FEAT_PRECOMPUTED": refused("the RefCOCO+ data set provides images and boxes, not precomputed "
                                              "box features"),
    "NETWORK.BERT_WITH_NSP_LOSS": warned("the RefCOCO+ model has no next-sentence loss; " + _NOT_READ),
    "NETWORK.BERT_WITH_MLM_LOSS": warned("the RefCOCO+ model has no masked-language loss; " + _NOT_READ),
    "NETWORK.ENABLE_CNN_REG_LOSS": warned("RefCOCO+ boxes have no class labels to regularise with (the reference "
                                          "ignores it too)"),
    "NETWORK.CNN_LOSS_WEIGHT": warned("no CNN regularisation loss in RefCOCO+; " + _NOT_READ),
    "NETWORK.ANS_LOSS_WEIGHT": warned("the loss is the box classification loss alone; " + _NOT_READ),
    "NETWORK.VLBERT.object_word_embed_mode": refused("the RefCOCO+ model has one class-agnostic box embedding "
                                                     "(mode 2), as the reference's"),
    "NETWORK.VLBERT.with_pooler": refused("the RefCOCO+ head reads the box states: a pooler would be an unused "
                                          "layer that distributed training cannot synchronise"),
    "NETWORK.CLASSIFIER_TYPE": warned("the RefCOCO+ head is fixed (the pretraining MVRC transform and a linear "
                                      "layer); " + _NOT_READ),
    "NETWORK.CLASSIFIER_HIDDEN_SIZE": warned("the RefCOCO+ head is fixed (the pretraining MVRC transform and a "
                                             "linear layer); " + _NOT_READ),
    "NETWORK.CLASSIFIER_DROPOUT": DONE,
    "NETWORK.CLASSIFIER_SIGMOID": warned("the box logits always go through a sigmoid (binary cross-entropy); "
                                         + _NOT_READ),
    "NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT": warned("positives and negatives weigh the same; " + _NOT_READ),
    "NETWORK.CLASSIFIER_PRETRAINED": warned(_VQA_KEY),
    "NETWORK.ANS_LOSS_TYPE": warned(_VQA_KEY),
    "NETWORK.REPLACE_OBJECT_CHANGE_LABEL": warned(_VQA_KEY),
    "TRAIN.LOSS_LOGGERS": DONE,
    "TRAIN.LABEL_SMOOTHING": refused("the RefCOCO+ loss is a binary cross-entropy per box, not a softmax "
                                     "cross-entropy, so there is no label distribution to smooth"),
}, (VLBERT_STATUS, VISUAL_SCALE_STATUS))


check_config = key_checker(refcoco_defaults, KEY_STATUS)
