"""VCR config: the shared defaults plus VCR's own keys (reference ``vcr/function/config.py``)."""
from common.config import common_defaults, task_api


def vcr_defaults():
    """Defaults of the VCR task as a fresh mutable CfgNode."""
    _C = common_defaults()
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


config, update_config, load_config = task_api(vcr_defaults)
