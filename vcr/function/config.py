"""VCR config: the shared defaults plus VCR's own keys (reference ``vcr/function/config.py``), and
what each key does here (``KEY_STATUS``, see :mod:`common.config.keys`)."""
from common.config import common_defaults, reference_api, task_rules
from common.config.keys import DONE, key_checker, refused, refused_if, task_key_status, warned
from common.config.values import PROBABILITY, int_at_least, number_above, number_at_least, one_of
from common.modeling.vlbert_config import (VISUAL_SCALE_RULES, VISUAL_SCALE_STATUS, VLBERT_RULES, VLBERT_STATUS,
                                           add_visual_scale_config, add_vlbert_config)


def vcr_defaults():
    """Defaults of the VCR task as a fresh mutable CfgNode."""
    _C = add_visual_scale_config(add_vlbert_config(common_defaults()))
    # The label is the 8th element of a VCR batch.
    _C.DATASET.LABEL_INDEX_IN_BATCH = 7

    # Copy the pretrained token-type row 0 into row 1 (answers) when loading PARTIAL_PRETRAIN.
    _C.NETWORK.PARTIAL_PRETRAIN_SEGMB_INIT = False
    _C.NETWORK.IMAGE_SEMANTIC = True
    # Question and answer in one segment.
    _C.NETWORK.QA_ONE_SENT = False
    # Dropout before the CNN regularisation classifier.
    _C.NETWORK.CNN_REG_DROPOUT = 0.0
    # CNN regularisation loss on top of the VL-BERT output (else on the RoI features).
    _C.NETWORK.CNN_LOSS_TOP = False
    # Put the answer before the question in the input.
    _C.NETWORK.ANSWER_FIRST = False
    # Initialise the answer classifier from the pretraining relationship head.
    _C.NETWORK.LOAD_REL_HEAD = True
    _C.NETWORK.VLBERT.object_word_embed_mode = 1
    _C.NETWORK.VLBERT.with_pooler = True

    _C.TRAIN.LOSS_LOGGERS = [('ans_loss', 'AnsLoss'), ('cnn_regularization_loss', 'CNNRegLoss')]
    return _C


# Valid values of the numeric keys that VCR's data set and model read (common.config.values).
VALUE_RULES = task_rules({
    "DATASET.MASK_SIZE": int_at_least(1),
    "NETWORK.CNN_LOSS_WEIGHT": number_at_least(0),
    "NETWORK.ANS_LOSS_WEIGHT": number_at_least(0),
    "NETWORK.VLBERT.object_word_embed_mode": one_of(1, 2, 3),
    "NETWORK.CLASSIFIER_HIDDEN_SIZE": int_at_least(1),
    "NETWORK.CLASSIFIER_DROPOUT": PROBABILITY,
    "NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT": number_above(0),
    "NETWORK.CNN_REG_DROPOUT": PROBABILITY,
}, (VLBERT_RULES, VISUAL_SCALE_RULES))

# The reference's module API (load a config for a run with the Task's load_config).
config, update_config = reference_api(vcr_defaults, VALUE_RULES)

# Keys of the VL-BERT group that VCR reads or refuses, and VCR's own keys.
KEY_STATUS = task_key_status(vcr_defaults(), {
    "DATASET.APPEND_INDEX": refused("the VCR model takes no sample-index input (the reference's neither)"),
    "DATASET.TASK": DONE,
    "DATASET.BASIC_ALIGN": DONE,
    "DATASET.DATASET_PATH": DONE,
    "DATASET.TRAIN_IMAGE_SET": DONE,
    "DATASET.VAL_IMAGE_SET": DONE,
    "DATASET.TEST_IMAGE_SET": DONE,
    "DATASET.TRAIN_ANNOTATION_FILE": DONE,
    "DATASET.VAL_ANNOTATION_FILE": DONE,
    "DATASET.TEST_ANNOTATION_FILE": DONE,
    "DATASET.ONLY_USE_RELEVANT_DETS": DONE,
    "DATASET.ADD_IMAGE_AS_A_BOX": DONE,
    "DATASET.ZIP_MODE": DONE,
    "DATASET.CACHE_MODE": refused("not implemented (the reference's VCR data set refuses it too)"),
    "DATASET.MASK_SIZE": DONE,
    "DATASET.QA2R_NOQ": DONE,
    "DATASET.QA2R_AUG": refused("not implemented (the reference's VCR data set refuses it too)"),
    "NETWORK.BLIND": DONE,
    "NETWORK.NO_GROUNDING": DONE,
    "NETWORK.FOR_MASK_VL_MODELING_PRETRAIN": refused("VCR has no masked pretraining mode (the reference's neither)"),
    "NETWORK.NO_OBJ_ATTENTION": DONE,
    "NETWORK.IMAGE_FEAT_PRECOMPUTED": refused("the VCR data set provides images and boxes, not precomputed box "
                                              "features"),
    "NETWORK.BERT_WITH_NSP_LOSS": warned("the VCR model has no next-sentence loss; the reference release never "
                                         "read it either"),
    "NETWORK.BERT_WITH_MLM_LOSS": warned("the VCR model has no masked-language loss; the reference release "
                                         "never acted on it either"),
    "NETWORK.ENABLE_CNN_REG_LOSS": DONE,
    "NETWORK.CNN_LOSS_WEIGHT": DONE,
    "NETWORK.ANS_LOSS_WEIGHT": DONE,
    "NETWORK.VLBERT.object_word_embed_mode": DONE,
    "NETWORK.VLBERT.with_pooler": DONE,
    "NETWORK.CLASSIFIER_TYPE": DONE,
    "NETWORK.CLASSIFIER_HIDDEN_SIZE": DONE,
    "NETWORK.CLASSIFIER_DROPOUT": DONE,
    "NETWORK.CLASSIFIER_SIGMOID": DONE,
    "NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT": DONE,
    "NETWORK.PARTIAL_PRETRAIN_SEGMB_INIT": DONE,
    "NETWORK.QA_ONE_SENT": DONE,
    "NETWORK.CNN_REG_DROPOUT": DONE,
    "NETWORK.CNN_LOSS_TOP": DONE,
    "NETWORK.ANSWER_FIRST": DONE,
    "NETWORK.LOAD_REL_HEAD": DONE,
    "TRAIN.LOSS_LOGGERS": DONE,
    # Smooths the softmax answer loss (not the CNN regularisation loss).
    "TRAIN.LABEL_SMOOTHING": refused_if(
        lambda cfg: cfg.NETWORK.CLASSIFIER_SIGMOID,
        "NETWORK.CLASSIFIER_SIGMOID makes the answer loss a binary cross-entropy per choice; label smoothing "
        "applies to the softmax cross-entropy (CLASSIFIER_SIGMOID false) only"),
}, (VLBERT_STATUS, VISUAL_SCALE_STATUS))


check_config = key_checker(vcr_defaults, KEY_STATUS)
