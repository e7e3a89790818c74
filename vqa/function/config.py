"""VQA config: the shared defaults plus VQA's own keys (reference ``vqa/function/config.py``), and what
each key does here (``KEY_STATUS``)."""
from common.config import common_defaults, reference_api, task_rules
from common.config.keys import DONE, key_checker, refused, refused_if, task_key_status, warned
from common.config.values import PROBABILITY, int_at_least, one_of
from common.modeling.vlbert_config import (VISUAL_SCALE_RULES, VISUAL_SCALE_STATUS, VLBERT_RULES, VLBERT_STATUS,
                                           add_answer_vocab_config, add_visual_scale_config, add_vlbert_config)


def vqa_defaults():
    """Defaults of the VQA task as a fresh mutable CfgNode."""
    _C = add_answer_vocab_config(add_visual_scale_config(add_vlbert_config(common_defaults())))
    # Boxes per image of the detections: "36" (fixed) or "10-100ada" (adaptive).
    _C.DATASET.BOXES = "36"
    _C.TRAIN.LOSS_LOGGERS = [('ans_loss', 'AnsLoss')]
    return _C


# Valid values of the numeric keys that VQA's data set and model read (common.config.values).
VALUE_RULES = task_rules({
    "DATASET.ANSWER_VOCAB_SIZE": int_at_least(1),
    "NETWORK.VLBERT.object_word_embed_mode": one_of(1, 2, 3),
    "NETWORK.CLASSIFIER_HIDDEN_SIZE": int_at_least(1),
    "NETWORK.CLASSIFIER_DROPOUT": PROBABILITY,
}, (VLBERT_RULES, VISUAL_SCALE_RULES))

# The reference's module API (load a config for a run with the Task's load_config).
config, update_config = reference_api(vqa_defaults, VALUE_RULES)

_NOT_IN_VQA_MODEL = "the VQA model does not read it (nor did the reference's)"
_NOT_IN_VQA_DATA = "the VQA data set does not read it (nor did the reference's): splits are DATASET.*_IMAGE_SET"
KEY_STATUS = task_key_status(vqa_defaults(), {
    "DATASET.APPEND_INDEX": refused("the VQA model takes no in-batch index field"),
    "DATASET.TASK": warned(_NOT_IN_VQA_DATA),
    "DATASET.BASIC_ALIGN": warned(_NOT_IN_VQA_DATA),
    "DATASET.DATASET_PATH": DONE,
    "DATASET.TRAIN_IMAGE_SET": DONE,
    "DATASET.VAL_IMAGE_SET": DONE,
    "DATASET.TEST_IMAGE_SET": DONE,
    "DATASET.TRAIN_ANNOTATION_FILE": warned(_NOT_IN_VQA_DATA),
    "DATASET.VAL_ANNOTATION_FILE": warned(_NOT_IN_VQA_DATA),
    "DATASET.TEST_ANNOTATION_FILE": warned(_NOT_IN_VQA_DATA),
    "DATASET.ONLY_USE_RELEVANT_DETS": warned(_NOT_IN_VQA_DATA),
    "DATASET.ADD_IMAGE_AS_A_BOX": DONE,
    "DATASET.ZIP_MODE": DONE,
    "DATASET.CACHE_MODE": refused("the reference does not implement it either; see the feature cache in "
                                  "data/PREPARE_DATA.md"),
    "DATASET.MASK_SIZE": warned("VQA has no segmentation masks"),
    "DATASET.QA2R_NOQ": warned(_NOT_IN_VQA_DATA),
    "DATASET.QA2R_AUG": warned(_NOT_IN_VQA_DATA),
    "DATASET.ANSWER_VOCAB_FILE": DONE,
    "DATASET.ANSWER_VOCAB_SIZE": DONE,
    # Its default (true) selects Pythia's imdb files, which the data set refuses with an error naming the
    # key; false (every paper config) reads the official files.
    "DATASET.USE_IMDB": DONE,
    "DATASET.BOXES": DONE,
    "NETWORK.IMAGE_FEAT_PRECOMPUTED": DONE,
    "NETWORK.BLIND": DONE,
    "NETWORK.NO_GROUNDING": DONE,
    "NETWORK.NO_OBJ_ATTENTION": DONE,
    "NETWORK.FOR_MASK_VL_MODELING_PRETRAIN": refused(_NOT_IN_VQA_MODEL),
    "NETWORK.BERT_WITH_NSP_LOSS": warned(_NOT_IN_VQA_MODEL),
    "NETWORK.BERT_WITH_MLM_LOSS": warned(_NOT_IN_VQA_MODEL),
    # acted on as in the reference: True (the shared default) builds the box head's regularizing predictor, which
    # the VQA loss never uses; False, the shipped configs' value, leaves it out
    "NETWORK.ENABLE_CNN_REG_LOSS": DONE,
    "NETWORK.CNN_LOSS_WEIGHT": warned("the VQA loss has no CNN regularisation term (as in the reference)"),
    "NETWORK.ANS_LOSS_WEIGHT": warned(_NOT_IN_VQA_MODEL),
    "NETWORK.VLBERT.object_word_embed_mode": DONE,
    "NETWORK.VLBERT.with_pooler": DONE,
    "NETWORK.CLASSIFIER_TYPE": DONE,
    "NETWORK.CLASSIFIER_HIDDEN_SIZE": DONE,
    "NETWORK.CLASSIFIER_DROPOUT": DONE,
    "NETWORK.CLASSIFIER_SIGMOID": refused("the VQA loss is chosen by NETWORK.ANS_LOSS_TYPE"),
    "NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT": refused("the VQA loss is chosen by NETWORK.ANS_LOSS_TYPE"),
    "NETWORK.CLASSIFIER_PRETRAINED": DONE,
    "NETWORK.ANS_LOSS_TYPE": DONE,
    "NETWORK.REPLACE_OBJECT_CHANGE_LABEL": warned(_NOT_IN_VQA_MODEL),
    "TRAIN.LOSS_LOGGERS": DONE,
    "TRAIN.LABEL_SMOOTHING": refused_if(
        lambda cfg: cfg.NETWORK.ANS_LOSS_TYPE != 'ce',
        "NETWORK.ANS_LOSS_TYPE 'bce' is a binary cross-entropy per answer; label smoothing applies to the "
        "softmax cross-entropy (ANS_LOSS_TYPE 'ce') only"),
}, (VLBERT_STATUS, VISUAL_SCALE_STATUS))


check_config = key_checker(vqa_defaults, KEY_STATUS)
