"""Pretraining config: the shared defaults plus pretraining keys (reference ``pretrain/function/config.py``).

``DATASET`` may be a list of mappings in YAML (one per data set); each entry is completed with the
DATASET defaults below.
"""
from common.config import common_defaults, task_api


def pretrain_defaults():
    """Defaults of the pretraining task as a fresh mutable CfgNode."""
    _C = common_defaults()
    _C.DATASET.ANSWER_VOCAB_FILE = ''
    _C.DATASET.ANSWER_VOCAB_SIZE = 3129
    # Text-only corpus: tokens per sequence and shortest sequence kept.
    _C.DATASET.SEQ_LEN = 64
    _C.DATASET.MIN_SEQ_LEN = 0

    # Train BERT from random init instead of BERT_MODEL_NAME.
    _C.NETWORK.VLBERT.from_scratch = False
    # Freeze the position embeddings.
    _C.NETWORK.VLBERT.pos_embedding_frozen = False
    # Classes of the masked RoI classification head (Visual Genome: 1600 + background).
    _C.NETWORK.VLBERT.visual_region_classes = 1601
    _C.NETWORK.VLBERT.with_pooler = True
    # Pretraining losses: caption-image relationship, masked language, masked RoI classification.
    _C.NETWORK.WITH_REL_LOSS = True
    _C.NETWORK.WITH_MLM_LOSS = True
    _C.NETWORK.WITH_MVRC_LOSS = True
    # Normalise MLM / MVRC losses per sample first, then over the batch.
    _C.NETWORK.MLM_LOSS_NORM_IN_BATCH_FIRST = False
    _C.NETWORK.MVRC_LOSS_NORM_IN_BATCH_FIRST = False
    # Zero the pixels of masked RoIs before the image encoder.
    _C.NETWORK.MASK_RAW_PIXELS = True

    _C.TRAIN.LOSS_LOGGERS = [('relationship_loss', 'RelLoss'), ('mlm_loss', 'MLMLoss'), ('mvrc_loss', 'MVRCLoss')]
    # The learnable visual scales are not used in pretraining.
    del _C.TRAIN['VISUAL_SCALE_TEXT_LR_MULT']
    del _C.TRAIN['VISUAL_SCALE_OBJECT_LR_MULT']
    del _C.TRAIN['VISUAL_SCALE_CLIP_GRAD_NORM']
    return _C


config, update_config, load_config = task_api(pretrain_defaults)
