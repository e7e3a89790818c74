"""VQA config: the shared defaults plus VQA's own keys (reference ``vqa/function/config.py``)."""
from common.config import common_defaults, task_api


def add_answer_vocab_keys(_C):
    """Answer vocabulary keys shared by the tasks that classify over a fixed answer list."""
    # Answer vocabulary file (one answer a line) and its size (VQA v2 top answers: 3129).
    _C.DATASET.ANSWER_VOCAB_FILE = ''
    _C.DATASET.ANSWER_VOCAB_SIZE = 3129
    # Use the pre-built image database (imdb) files.
    _C.DATASET.USE_IMDB = True
    # Initialise the classifier from a pretrained head.
    _C.NETWORK.CLASSIFIER_PRETRAINED = False
    # Answer loss: 'bce' (soft scores) or 'ce'.
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
