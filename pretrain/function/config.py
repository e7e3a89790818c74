"""Pretraining config: the shared defaults plus pretraining keys (reference ``pretrain/function/config.py``),
and what each key does here (``KEY_STATUS``).

``DATASET`` may be a list of mappings in YAML (one per data set); each entry is completed with the
DATASET defaults below.
"""
from common.config import common_defaults, reference_api, task_rules
from common.config.keys import DONE, key_checker, refused, task_key_status, warned
from common.config.values import PROBABILITY, Rule, int_at_least
from common.data.box_sources import GRID_PATTERN
from common.modeling.vlbert_config import VLBERT_RULES, VLBERT_STATUS, add_vlbert_config


def pretrain_defaults():
    """Defaults of the pretraining task as a fresh mutable CfgNode."""
    _C = add_vlbert_config(common_defaults())
    # The reference's answer vocabulary keys (without those of add_answer_vocab_config it lacked).
    _C.DATASET.ANSWER_VOCAB_FILE = ''
    _C.DATASET.ANSWER_VOCAB_SIZE = 3129
    # Text-only corpus: tokens per sequence and shortest sequence kept.
    _C.DATASET.SEQ_LEN = 64
    _C.DATASET.MIN_SEQ_LEN = 0
    # (new) Share of unreadable images (missing, truncated, undecodable; 'cc_shards': samples with an unreadable
    # image, caption, JSON or .npy member) a caption data set may skip
    # before the run stops, in [0, 1]; 0 makes the first one an error.
    _C.DATASET.MAX_SKIPPED_SHARE = 0.01
    # (new) DATASET.DATASET 'cc_shards' (webdataset / img2dataset tar shards, pretrain/data/caption_shards.py):
    # the shards of each split as a brace pattern under DATASET_PATH ('cc3m/{00000..00331}.tar'; '' = none).
    _C.DATASET.TRAIN_SHARDS = ''
    _C.DATASET.VAL_SHARDS = ''
    _C.DATASET.TEST_SHARDS = ''
    # (new) 'cc_shards': samples in the shuffle buffer that mixes consecutive shards of the epoch's seeded shard
    # order (1 = each shard in file order).
    _C.DATASET.SHUFFLE_BUFFER = 1000
    # (new) 'cc_shards': 'ROWSxCOLS' (e.g. '4x4') gives every image a grid of regions instead of the shards'
    # detector output ('' = the detector output); needs NETWORK.WITH_MVRC_LOSS false (no region classes).
    _C.DATASET.GRID_BOXES = ''

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
    return _C


# Valid values of the pretraining keys (common.config.values).
VALUE_RULES = task_rules({
    "DATASET.SEQ_LEN": int_at_least(1),
    "DATASET.MIN_SEQ_LEN": int_at_least(0),
    "DATASET.MAX_SKIPPED_SHARE": PROBABILITY,
    "DATASET.SHUFFLE_BUFFER": int_at_least(1),
    "DATASET.GRID_BOXES": Rule(lambda v, get: v == "" or GRID_PATTERN.fullmatch(v) is not None,
                               lambda get: "'ROWSxCOLS' with both >= 1 (e.g. '4x4') or ''"),
    "NETWORK.VLBERT.visual_region_classes": int_at_least(1),
}, (VLBERT_RULES,))

# The reference's module API (load a config for a run with the Task's load_config).
config, update_config = reference_api(pretrain_defaults, VALUE_RULES)

_NOT_IN_MODEL = "the pretraining models do not read it (nor did the reference's)"
_NOT_IN_DATA = "the pretraining data sets do not read it (nor did the reference's)"
_NO_CLASSIFIER = "pretraining has no answer classifier; " + _NOT_IN_MODEL
KEY_STATUS = task_key_status(pretrain_defaults(), dict(
    {key: DONE for key in ("DATASET.DATASET_PATH", "DATASET.TRAIN_IMAGE_SET", "DATASET.VAL_IMAGE_SET",
                           "DATASET.TEST_IMAGE_SET", "DATASET.TRAIN_ANNOTATION_FILE", "DATASET.VAL_ANNOTATION_FILE",
                           "DATASET.TEST_ANNOTATION_FILE", "DATASET.ADD_IMAGE_AS_A_BOX", "DATASET.ZIP_MODE",
                           "DATASET.APPEND_INDEX", "DATASET.SEQ_LEN", "DATASET.MIN_SEQ_LEN",
                           "DATASET.MAX_SKIPPED_SHARE", "DATASET.TRAIN_SHARDS", "DATASET.VAL_SHARDS",
                           "DATASET.TEST_SHARDS", "DATASET.SHUFFLE_BUFFER", "DATASET.GRID_BOXES",
                           "TRAIN.LOSS_LOGGERS")},
    **{key: warned(_NOT_IN_DATA) for key in ("DATASET.TASK", "DATASET.BASIC_ALIGN", "DATASET.ONLY_USE_RELEVANT_DETS",
                                             "DATASET.MASK_SIZE", "DATASET.QA2R_NOQ", "DATASET.QA2R_AUG",
                                             "DATASET.ANSWER_VOCAB_FILE", "DATASET.ANSWER_VOCAB_SIZE")},
    **{
        "DATASET.LABEL_INDEX_IN_BATCH": warned("pretraining batches carry their labels into the model (the "
                                               "reference's pretraining ignored it too)"),
        "DATASET.CACHE_MODE": refused("the caption data sets read each file when a sample needs it (the reference "
                                      "refused CACHE_MODE too)"),
        "NETWORK.IMAGE_FEAT_PRECOMPUTED": DONE,
        "NETWORK.BLIND": refused(_NOT_IN_MODEL),
        "NETWORK.NO_GROUNDING": refused(_NOT_IN_MODEL),
        "NETWORK.FOR_MASK_VL_MODELING_PRETRAIN": warned(_NOT_IN_MODEL),
        "NETWORK.NO_OBJ_ATTENTION": refused(_NOT_IN_MODEL),
        "NETWORK.BERT_WITH_NSP_LOSS": warned("the pretraining losses are NETWORK.WITH_*_LOSS; " + _NOT_IN_MODEL),
        "NETWORK.BERT_WITH_MLM_LOSS": warned("the pretraining losses are NETWORK.WITH_*_LOSS; " + _NOT_IN_MODEL),
        "NETWORK.ENABLE_CNN_REG_LOSS": warned(_NOT_IN_MODEL),
        "NETWORK.CNN_LOSS_WEIGHT": warned(_NOT_IN_MODEL),
        "NETWORK.ANS_LOSS_WEIGHT": warned(_NOT_IN_MODEL),
        "NETWORK.VLBERT.object_word_embed_mode": refused("the pretraining models use one object embedding (mode 2)"),
        "NETWORK.VLBERT.with_pooler": DONE,
        "NETWORK.CLASSIFIER_TYPE": warned(_NO_CLASSIFIER),
        "NETWORK.CLASSIFIER_HIDDEN_SIZE": warned(_NO_CLASSIFIER),
        "NETWORK.CLASSIFIER_DROPOUT": warned(_NO_CLASSIFIER),
        "NETWORK.CLASSIFIER_SIGMOID": warned(_NO_CLASSIFIER),
        "NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT": warned(_NO_CLASSIFIER),
        "TRAIN.LABEL_SMOOTHING": refused("the pretraining losses (masked language / region modelling, "
                                         "relationship) are not smoothed here; label smoothing applies to the "
                                         "answer losses of VCR and VQA ('ce')"),
        "NETWORK.VLBERT.from_scratch": DONE,
        "NETWORK.VLBERT.pos_embedding_frozen": DONE,
        "NETWORK.VLBERT.visual_region_classes": DONE,
        "NETWORK.WITH_REL_LOSS": DONE,
        "NETWORK.WITH_MLM_LOSS": DONE,
        "NETWORK.WITH_MVRC_LOSS": DONE,
        "NETWORK.MLM_LOSS_NORM_IN_BATCH_FIRST": DONE,
        "NETWORK.MVRC_LOSS_NORM_IN_BATCH_FIRST": DONE,
        "NETWORK.MASK_RAW_PIXELS": DONE,
    }), (VLBERT_STATUS,))


check_config = key_checker(pretrain_defaults, KEY_STATUS)
