"""The config keys of the VL-BERT model family (ResNet Fast R-CNN image encoder + VL-BERT), which the
VL-BERT tasks (VCR, VQA, RefCOCO+, pretraining) add to :func:`common.config.common_defaults`, as
detectron2's ``add_pointrend_config`` does; a task with another model (an image classifier) adds none.

Key names and defaults are those the reference release (github jackroos/VL-BERT) declared in every
task's ``function/config.py``, so its YAML files load unchanged. Next to the keys: what each does
(:data:`VLBERT_STATUS`, see :mod:`common.config.keys`) and their valid values (:data:`VLBERT_RULES`, see
:mod:`common.config.values`); :class:`common.modeling.vlbert_task.VLBertTask` checks the files they name.
"""
from yacs.config import CfgNode

from common.config.keys import DONE, refused, refused_if, warned
from common.config.values import PROBABILITY, int_at_least, number_at_least, one_of, Rule


def add_vlbert_config(_C):
    """Add the VL-BERT keys to the config ``_C`` (in place); returns ``_C``."""
    # Data keys the reference declared for every VL-BERT task; a task reads those its data set needs.
    # VCR sub-task: 'Q2A', 'QA2R' or 'Q2AR'.
    _C.DATASET.TASK = 'Q2AR'
    # Align words to boxes by basic tokenisation only (reference option for VCR).
    _C.DATASET.BASIC_ALIGN = False
    # Root for cached files (database caches).
    _C.DATASET.ROOT_PATH = ''
    # Annotation file names for each split, relative to DATASET_PATH.
    _C.DATASET.TRAIN_ANNOTATION_FILE = ''
    _C.DATASET.VAL_ANNOTATION_FILE = ''
    _C.DATASET.TEST_ANNOTATION_FILE = ''
    # Keep only the boxes that the text refers to (plus the whole image box if added).
    _C.DATASET.ONLY_USE_RELEVANT_DETS = True
    # Add the whole image as box 0.
    _C.DATASET.ADD_IMAGE_AS_A_BOX = True
    # Read images and metadata from zip archives ('archive.zip@/inner/path').
    _C.DATASET.ZIP_MODE = False
    # Keep decoded images in memory after the first read.
    _C.DATASET.CACHE_MODE = False
    # Rebuild the annotation database instead of reading a cached one.
    _C.DATASET.IGNORE_DB_CACHE = True
    # Side of the object masks in pixels.
    _C.DATASET.MASK_SIZE = 14
    # QA->R without the question in the input.
    _C.DATASET.QA2R_NOQ = False
    # QA->R augmented with the wrong answers (reference option).
    _C.DATASET.QA2R_AUG = False

    # Text only: the image features are replaced by zeros (a blind baseline).
    _C.NETWORK.BLIND = False
    # Do not link object references in the text to their boxes.
    _C.NETWORK.NO_GROUNDING = False
    # Checkpoint whose 'state_dict' initialises matching weights; '' for none.
    _C.NETWORK.PARTIAL_PRETRAIN = ""
    # Renames applied to PARTIAL_PRETRAIN keys, each "old_prefix->new_prefix".
    _C.NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES = []
    # Build the masked visual-linguistic pretraining variant of the model.
    _C.NETWORK.FOR_MASK_VL_MODELING_PRETRAIN = False
    # Text tokens do not attend to object tokens.
    _C.NETWORK.NO_OBJ_ATTENTION = False
    # ResNet depth of the image encoder: 18, 34, 50, 101 or 152.
    _C.NETWORK.IMAGE_NUM_LAYERS = 50
    # res5 with stride 1 and dilation 2 (features stay at 1/16).
    _C.NETWORK.IMAGE_C5_DILATED = False
    # Stride in the first 1x1 conv of a bottleneck (Caffe/MSRA weights) instead of the 3x3.
    _C.NETWORK.IMAGE_STRIDE_IN_1x1 = False
    # Boxes come with precomputed features instead of running the ResNet.
    _C.NETWORK.IMAGE_FEAT_PRECOMPUTED = False
    # Image encoder weights; '' = random. ResNet: a prefix, loads {IMAGE_PRETRAINED}-{IMAGE_PRETRAINED_EPOCH:04d}.model;
    # ViT (IMAGE_ENCODER 'vit'): a timm .safetensors / .pth file of IMAGE_VIT_ARCH.
    _C.NETWORK.IMAGE_PRETRAINED = ''
    _C.NETWORK.IMAGE_PRETRAINED_EPOCH = 0
    # ResNet stages whose weights are frozen (1 = stem + res2, 2 = res3, ...).
    _C.NETWORK.IMAGE_FROZEN_BACKBONE_STAGES = [1, 2]
    # BatchNorm of the ResNet uses its running statistics and affine weights frozen.
    _C.NETWORK.IMAGE_FROZEN_BN = True
    # Size of each RoI feature after obj_downsample.
    _C.NETWORK.IMAGE_FINAL_DIM = 512
    # Add an object class embedding to each RoI feature.
    _C.NETWORK.IMAGE_SEMANTIC = False
    # Also return the res5 feature map.
    _C.NETWORK.OUTPUT_CONV5 = False
    # BERT folder (vocab.txt + weights, reference or Hugging Face format); '' = random init.
    _C.NETWORK.BERT_MODEL_NAME = 'bert-base-uncased'
    # Extra BERT weights prefix ({path}-{epoch:04d}.model); '' for none.
    _C.NETWORK.BERT_PRETRAINED = ''
    _C.NETWORK.BERT_PRETRAINED_EPOCH = 0
    # Freeze the BERT weights.
    _C.NETWORK.BERT_FROZEN = True
    # Ground object references in the question / answers.
    _C.NETWORK.BERT_ALIGN_QUESTION = True
    _C.NETWORK.BERT_ALIGN_ANSWER = True
    # Which encoder layer's output the task head reads (-1 = last).
    _C.NETWORK.BERT_USE_LAYER = -2
    # Auxiliary BERT losses.
    _C.NETWORK.BERT_WITH_NSP_LOSS = False
    _C.NETWORK.BERT_WITH_MLM_LOSS = False
    # Object classification loss on RoI features (regularises the image encoder).
    _C.NETWORK.ENABLE_CNN_REG_LOSS = True
    # Weights of the CNN regularisation loss and of the answer loss in the total loss.
    _C.NETWORK.CNN_LOSS_WEIGHT = 1.0
    _C.NETWORK.ANS_LOSS_WEIGHT = 1.0

    _C.NETWORK.VLBERT = CfgNode()
    # Size of the visual input features fed to the visual embedding.
    _C.NETWORK.VLBERT.input_size = 1280
    # Visual input transform: 1 LN + 1x1 conv, 2 + dropout, 3 + a BERT layer.
    _C.NETWORK.VLBERT.input_transform_type = 1
    # Freeze the word embedding matrix.
    _C.NETWORK.VLBERT.word_embedding_frozen = False
    # Objects take one position id right after the text (else a fixed id).
    _C.NETWORK.VLBERT.obj_pos_id_relative = True
    # BERT sizes (hidden units, visual feature units, layers, heads, feed-forward units).
    _C.NETWORK.VLBERT.hidden_size = 512
    _C.NETWORK.VLBERT.visual_size = 512
    _C.NETWORK.VLBERT.num_hidden_layers = 4
    _C.NETWORK.VLBERT.num_attention_heads = 8
    _C.NETWORK.VLBERT.intermediate_size = 2048
    # Feed-forward activation ('gelu', 'relu', 'swish').
    _C.NETWORK.VLBERT.hidden_act = "gelu"
    # Dropout probabilities of hidden states and of attention weights.
    _C.NETWORK.VLBERT.hidden_dropout_prob = 0.1
    _C.NETWORK.VLBERT.attention_probs_dropout_prob = 0.1
    # Longest sequence in tokens (text + objects).
    _C.NETWORK.VLBERT.max_position_embeddings = 512
    # Segment types: 0 question, 1 answer, 2 objects.
    _C.NETWORK.VLBERT.type_vocab_size = 3
    # WordPiece vocabulary size (bert-base-uncased: 30522).
    _C.NETWORK.VLBERT.vocab_size = 30522
    # Std of the normal init of weights.
    _C.NETWORK.VLBERT.initializer_range = 0.02
    # Initial values of the learnable scales of visual features for text and object tokens.
    _C.NETWORK.VLBERT.visual_scale_text_init = 0.0
    _C.NETWORK.VLBERT.visual_scale_object_init = 0.0
    # LayerNorm on visual features instead of the learnable scales.
    _C.NETWORK.VLBERT.visual_ln = False
    # Object-linguistic embedding: 1 class embedding, 2 one shared embedding, 3 mean word embedding.
    _C.NETWORK.VLBERT.object_word_embed_mode = 2
    # Add BERT's pooler on the first token.
    _C.NETWORK.VLBERT.with_pooler = False
    # Position id of padding; -1 uses none.
    _C.NETWORK.VLBERT.position_padding_idx = -1

    # Answer classifier: '1fc' or '2fc' (hidden layer of CLASSIFIER_HIDDEN_SIZE units).
    _C.NETWORK.CLASSIFIER_TYPE = "2fc"
    _C.NETWORK.CLASSIFIER_HIDDEN_SIZE = 1024
    _C.NETWORK.CLASSIFIER_DROPOUT = 0.1
    # Sigmoid (binary per answer) instead of softmax loss, and its positive-class weight.
    _C.NETWORK.CLASSIFIER_SIGMOID = False
    _C.NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT = 1.0
    # (new) Recompute encoder layer activations in backward to save memory.
    _C.NETWORK.GRADIENT_CHECKPOINTING = False
    # (new) RoI Align output side (cells) fed to res5; 14 is the reference's. res5's output (and
    # DATASET.MASK_SIZE) is this side with IMAGE_C5_DILATED, else half of it rounded up.
    _C.NETWORK.IMAGE_ROI_POOLED_SIZE = 14
    # (new) Image encoder: 'resnet' (Fast R-CNN on a ResNet, the paper's) or 'vit' (a timm ViT, RoI Align on its
    # patch map; common/modeling/vit_encoder.py). The IMAGE_VIT_* keys and IMAGE_ATTN_FP32 are the ViT's.
    _C.NETWORK.IMAGE_ENCODER = 'resnet'
    # (new) timm model name and extra timm.create_model keyword arguments, [[name, value], ...]
    # (e.g. [[embed_dim, 192], [depth, 4], [num_heads, 3], [drop_path_rate, 0.1]]).
    _C.NETWORK.IMAGE_VIT_ARCH = 'vit_base_patch16_224'
    _C.NETWORK.IMAGE_VIT_ARCH_KWARGS = []
    # (new) Frozen ViT parts: -1 none; 0 the patch and position embeddings and class token; N those and blocks 0..N-1.
    _C.NETWORK.IMAGE_VIT_FROZEN_BLOCKS = -1
    # (new) Feature of a box covering the whole image (DATASET.ADD_IMAGE_AS_A_BOX's box 0): the ViT's 'cls' token
    # or the 'mean' of the image's patch tokens (a ViT without a class token).
    _C.NETWORK.IMAGE_VIT_WHOLE_IMAGE = 'cls'
    # (new) ViT attention in fp32 inside fp16 / bf16 autocast (fp16 attention logits overflow into NaN losses).
    _C.NETWORK.IMAGE_ATTN_FP32 = False
    return _C


def add_visual_scale_config(_C):
    """Add the optimizer keys of the learnable visual scales (:func:`common.optim.visual_scale_groups`)
    to ``_C`` (in place), for the fine-tuning tasks; returns ``_C``."""
    # LR multipliers and gradient clipping (-1 = off) of the learnable visual scales.
    _C.TRAIN.VISUAL_SCALE_TEXT_LR_MULT = 1.0
    _C.TRAIN.VISUAL_SCALE_OBJECT_LR_MULT = 1.0
    _C.TRAIN.VISUAL_SCALE_CLIP_GRAD_NORM = -1.0
    return _C


def add_answer_vocab_config(_C):
    """Add the answer vocabulary keys (tasks that classify over a fixed answer list) to ``_C`` (in
    place); returns ``_C``."""
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


_REFERENCE_UNUSED = "it has no effect (the reference release never read it either)"
# Keys only some VL-BERT tasks' data sets or heads read: a task that reads one says DONE in its own table.
_TASK_DOES_NOT_READ = warned("this task's data set and model do not read it")

def _vit(cfg):
    return cfg.NETWORK.IMAGE_ENCODER == 'vit'


# Keys of one image encoder: a value other than the default stops a run that builds the other one.
RESNET_ONLY_KEYS = ("NETWORK.IMAGE_NUM_LAYERS", "NETWORK.IMAGE_C5_DILATED", "NETWORK.IMAGE_STRIDE_IN_1x1",
                    "NETWORK.IMAGE_PRETRAINED_EPOCH", "NETWORK.IMAGE_FROZEN_BACKBONE_STAGES", "NETWORK.IMAGE_FROZEN_BN")
VIT_ONLY_KEYS = ("NETWORK.IMAGE_VIT_ARCH", "NETWORK.IMAGE_VIT_ARCH_KWARGS", "NETWORK.IMAGE_VIT_FROZEN_BLOCKS",
                 "NETWORK.IMAGE_VIT_WHOLE_IMAGE", "NETWORK.IMAGE_ATTN_FP32")
_RESNET_ONLY = refused_if(_vit, "only the ResNet image encoder reads it, and NETWORK.IMAGE_ENCODER is 'vit'")
_VIT_ONLY = refused_if(lambda cfg: not _vit(cfg), "only the ViT image encoder (NETWORK.IMAGE_ENCODER 'vit') reads it")

# What each key of add_vlbert_config does (common.config.keys); a task's KEY_STATUS may override an entry.
VLBERT_STATUS = dict(
    {key: _TASK_DOES_NOT_READ for key in (
        "DATASET.TASK", "DATASET.BASIC_ALIGN", "DATASET.TRAIN_ANNOTATION_FILE", "DATASET.VAL_ANNOTATION_FILE",
        "DATASET.TEST_ANNOTATION_FILE", "DATASET.ONLY_USE_RELEVANT_DETS", "DATASET.ADD_IMAGE_AS_A_BOX",
        "DATASET.ZIP_MODE", "DATASET.CACHE_MODE", "DATASET.MASK_SIZE", "DATASET.QA2R_NOQ", "DATASET.QA2R_AUG",
        "NETWORK.BLIND", "NETWORK.NO_GROUNDING", "NETWORK.FOR_MASK_VL_MODELING_PRETRAIN",
        "NETWORK.NO_OBJ_ATTENTION", "NETWORK.IMAGE_FEAT_PRECOMPUTED", "NETWORK.BERT_WITH_NSP_LOSS",
        "NETWORK.BERT_WITH_MLM_LOSS", "NETWORK.ENABLE_CNN_REG_LOSS", "NETWORK.CNN_LOSS_WEIGHT",
        "NETWORK.ANS_LOSS_WEIGHT", "NETWORK.VLBERT.object_word_embed_mode", "NETWORK.VLBERT.with_pooler",
        "NETWORK.CLASSIFIER_TYPE", "NETWORK.CLASSIFIER_HIDDEN_SIZE", "NETWORK.CLASSIFIER_DROPOUT",
        "NETWORK.CLASSIFIER_SIGMOID", "NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT",
        "DATASET.ANSWER_VOCAB_FILE", "DATASET.ANSWER_VOCAB_SIZE", "DATASET.USE_IMDB",
        "NETWORK.CLASSIFIER_PRETRAINED", "NETWORK.ANS_LOSS_TYPE", "NETWORK.REPLACE_OBJECT_CHANGE_LABEL")},
    **{key: DONE for key in (
        "NETWORK.PARTIAL_PRETRAIN", "NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES", "NETWORK.IMAGE_PRETRAINED",
        "NETWORK.IMAGE_FINAL_DIM", "NETWORK.IMAGE_SEMANTIC", "NETWORK.BERT_MODEL_NAME", "NETWORK.BERT_PRETRAINED",
        "NETWORK.BERT_PRETRAINED_EPOCH", "NETWORK.BERT_FROZEN", "NETWORK.VLBERT.word_embedding_frozen",
        "NETWORK.VLBERT.obj_pos_id_relative", "NETWORK.VLBERT.hidden_size", "NETWORK.VLBERT.visual_size",
        "NETWORK.VLBERT.num_hidden_layers", "NETWORK.VLBERT.num_attention_heads",
        "NETWORK.VLBERT.intermediate_size", "NETWORK.VLBERT.hidden_act", "NETWORK.VLBERT.hidden_dropout_prob",
        "NETWORK.VLBERT.attention_probs_dropout_prob", "NETWORK.VLBERT.max_position_embeddings",
        "NETWORK.VLBERT.type_vocab_size", "NETWORK.VLBERT.vocab_size", "NETWORK.VLBERT.initializer_range",
        "NETWORK.VLBERT.visual_scale_text_init", "NETWORK.VLBERT.visual_scale_object_init",
        "NETWORK.VLBERT.visual_ln", "NETWORK.VLBERT.position_padding_idx", "NETWORK.GRADIENT_CHECKPOINTING",
        "NETWORK.IMAGE_ROI_POOLED_SIZE")},
    **{key: _RESNET_ONLY for key in RESNET_ONLY_KEYS},
    **{key: _VIT_ONLY for key in VIT_ONLY_KEYS},
    **{
        "NETWORK.IMAGE_ENCODER": refused_if(
            lambda cfg: cfg.NETWORK.IMAGE_FEAT_PRECOMPUTED,
            "NETWORK.IMAGE_FEAT_PRECOMPUTED: the boxes carry their features, no image encoder runs"),
        "DATASET.ROOT_PATH": warned("no annotation database cache is written, so no cache root is needed"),
        "DATASET.IGNORE_DB_CACHE": warned("the annotations are always read from the annotation files (no cache)"),
        "NETWORK.OUTPUT_CONV5": refused("the reference release never defined the conv5 image head it needs"),
        "NETWORK.BERT_ALIGN_QUESTION": warned("object tags always ground the text; " + _REFERENCE_UNUSED),
        "NETWORK.BERT_ALIGN_ANSWER": warned("object tags always ground the text; " + _REFERENCE_UNUSED),
        "NETWORK.BERT_USE_LAYER": warned("the task heads read the last layer; " + _REFERENCE_UNUSED),
        "NETWORK.VLBERT.input_size": warned("the visual input width is NETWORK.VLBERT.visual_size; "
                                            + _REFERENCE_UNUSED),
        "NETWORK.VLBERT.input_transform_type": warned(_REFERENCE_UNUSED),
    })

# Valid values of the VL-BERT keys (common.config.values).
VLBERT_RULES = {
    "DATASET.LMDB_MODE": Rule(lambda v, get: not (v and get("DATASET.ZIP_MODE")),
                              lambda get: "false when DATASET.ZIP_MODE is true (one storage at a time)",
                              ("DATASET.ZIP_MODE",)),
    "NETWORK.IMAGE_NUM_LAYERS": one_of(18, 34, 50, 101, 152),
    "NETWORK.IMAGE_PRETRAINED_EPOCH": int_at_least(0),
    "NETWORK.IMAGE_FINAL_DIM": int_at_least(1),
    "NETWORK.IMAGE_ROI_POOLED_SIZE": int_at_least(1),
    "NETWORK.IMAGE_ENCODER": one_of('resnet', 'vit'),
    "NETWORK.IMAGE_VIT_FROZEN_BLOCKS": int_at_least(-1),
    "NETWORK.IMAGE_VIT_WHOLE_IMAGE": one_of('cls', 'mean'),
    "NETWORK.BERT_PRETRAINED_EPOCH": int_at_least(0),
    "NETWORK.VLBERT.hidden_size": int_at_least(1),
    "NETWORK.VLBERT.visual_size": int_at_least(1),
    "NETWORK.VLBERT.num_hidden_layers": int_at_least(1),
    "NETWORK.VLBERT.num_attention_heads": Rule(
        lambda v, get: v >= 1 and get("NETWORK.VLBERT.hidden_size") % v == 0,
        lambda get: "an int >= 1 dividing NETWORK.VLBERT.hidden_size ({})".format(get("NETWORK.VLBERT.hidden_size")),
        ("NETWORK.VLBERT.hidden_size",)),
    "NETWORK.VLBERT.intermediate_size": int_at_least(1),
    "NETWORK.VLBERT.hidden_dropout_prob": PROBABILITY,
    "NETWORK.VLBERT.attention_probs_dropout_prob": PROBABILITY,
    "NETWORK.VLBERT.max_position_embeddings": int_at_least(1),
    "NETWORK.VLBERT.type_vocab_size": int_at_least(1),
    "NETWORK.VLBERT.vocab_size": int_at_least(1),
    "NETWORK.VLBERT.initializer_range": number_at_least(0),
}

# Status and valid values of the keys of add_visual_scale_config.
VISUAL_SCALE_STATUS = {"TRAIN.VISUAL_SCALE_TEXT_LR_MULT": DONE, "TRAIN.VISUAL_SCALE_OBJECT_LR_MULT": DONE,
                       "TRAIN.VISUAL_SCALE_CLIP_GRAD_NORM": DONE}
VISUAL_SCALE_RULES = {"TRAIN.VISUAL_SCALE_TEXT_LR_MULT": number_at_least(0),
                      "TRAIN.VISUAL_SCALE_OBJECT_LR_MULT": number_at_least(0)}

