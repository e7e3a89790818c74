"""VQA config: the shared defaults plus VQA's own keys (reference ``vqa/function/config.py``), and what
each key does here (``KEY_STATUS``): the VQA model exists, VQA training does not yet."""
from common.config import common_defaults, task_api
from common.config_keys import DONE, key_checker, refused, task_key_status, warned

NO_TRAINING = refused("VQA training is not in this release yet (no vqa/train_end2end.py)")
DATA_KEYS = ("DATASET.APPEND_INDEX", "DATASET.TASK", "DATASET.BASIC_ALIGN", "DATASET.DATASET_PATH",
             "DATASET.TRAIN_IMAGE_SET", "DATASET.VAL_IMAGE_SET", "DATASET.TEST_IMAGE_SET",
             "DATASET.TRAIN_ANNOTATION_FILE", "DATASET.VAL_ANNOTATION_FILE", "DATASET.TEST_ANNOTATION_FILE",
             "DATASET.ONLY_USE_RELEVANT_DETS", "DATASET.ADD_IMAGE_AS_A_BOX", "DATASET.ZIP_MODE",
             "DATASET.CACHE_MODE", "DATASET.MASK_SIZE", "DATASET.QA2R_NOQ", "DATASET.QA2R_AUG",
             "DATASET.ANSWER_VOCAB_FILE", "NETWORK.IMAGE_FEAT_PRECOMPUTED", "TRAIN.LOSS_LOGGERS")


def add_answer_vocab_keys(_C):
    """Answer vocabulary keys shared by the tasks that classify over a fixed answer list."""
    # Answer vocabulary file (one answer a line) and its size (VQA v2 top answers: 3129).
    _C.DATASET.ANSWER_VOCAB_FILE = ''
    _C.DATASET.ANSWER_VOCAB_SIZE = 3129
    # Use the pre-built image database (imdb) files.
    _C.DATASET.USE_IMDB = True
    # Initialise the classifier from a pretrained head.
    _C.NETWORK.CLASSIFIER_PRETRAINED = False
    # Answer loss: 'bce' (binary cross-entropy per answer with the soft scores, times the number of
    # answers) or 'ce' (softmax cross-entropy against the soft scores).
    _C.NETWORK.ANS_LOSS_TYPE = 'bce'
    # Object replacement augmentation changes the label.
    _C.NETWORK.REPLACE_OBJECT_CHANGE_LABEL = True
    return _C


def vqa_defaults():
    """Defaults of the VQA task as a fresh mutable CfgNode."""
    _C = add_answer_vocab_keys(common_defaults())
    # Boxes per image of the detections: "36" (fixed) or "10-100ada" (adaptive).
    _C.DATASET.BOXES = "36"
    _C.TRAIN.LOSS_LOGGERS = [('ans_loss', 'AnsLoss')]
    return _C


config, update_config, load_config = task_api(vqa_defaults)

_NOT_IN_VQA_MODEL = "the VQA model does not read it (nor did the reference's)"
KEY_STATUS = task_key_status(vqa_defaults(), dict(
    {key: NO_TRAINING for key in DATA_KEYS + ("DATASET.USE_IMDB", "DATASET.BOXES")},
    **{
        "NETWORK.BLIND": refused(_NOT_IN_VQA_MODEL),
        "NETWORK.NO_GROUNDING": DONE,
        "NETWORK.FOR_MASK_VL_MODELING_PRETRAIN": refused(_NOT_IN_VQA_MODEL),
        "NETWORK.NO_OBJ_ATTENTION": refused(_NOT_IN_VQA_MODEL),
        "NETWORK.BERT_WITH_NSP_LOSS": warned(_NOT_IN_VQA_MODEL),
        "NETWORK.BERT_WITH_MLM_LOSS": warned(_NOT_IN_VQA_MODEL),
        "NETWORK.ENABLE_CNN_REG_LOSS": warned("the VQA loss has no CNN regularisation term (as in the reference)"),
        "NETWORK.CNN_LOSS_WEIGHT": warned("the VQA loss has no CNN regularisation term (as in the reference)"),
        "NETWORK.ANS_LOSS_WEIGHT": warned(_NOT_IN_VQA_MODEL),
        "NETWORK.VLBERT.object_word_embed_mode": DONE,
        "NETWORK.VLBERT.with_pooler": DONE,
        "NETWORK.CLASSIFIER_TYPE": DONE,
        "NETWORK.CLASSIFIER_HIDDEN_SIZE": DONE,
        "NETWORK.CLASSIFIER_DROPOUT": DONE,
        "NETWORK.CLASSIFIER_SIGMOID": refused("the VQA loss is chosen by NETWORK.ANS_LOSS_TYPE"),
        "NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT": refused("the VQA loss is chosen by NETWORK.ANS_LOSS_TYPE"),
        "DATASET.ANSWER_VOCAB_SIZE": DONE,
        "NETWORK.CLASSIFIER_PRETRAINED": refused("VQA training is not in this release yet (the classifier is "
                                                 "initialised from the training set's answer vocabulary)"),
        "NETWORK.ANS_LOSS_TYPE": DONE,
        "NETWORK.REPLACE_OBJECT_CHANGE_LABEL": warned(_NOT_IN_VQA_MODEL),
    }))


check_config = key_checker(vqa_defaults, KEY_STATUS)
