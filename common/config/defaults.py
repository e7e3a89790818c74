"""The config keys every task shares, with their defaults, meanings and units.

Key names and default values are those of the reference release (github jackroos/VL-BERT,
``*/function/config.py``) so that its paper YAML files load unchanged. Keys we added are marked
``(new)``. Each task's ``<task>/function/config.py`` adds its own keys to :func:`common_defaults`.
"""
from yacs.config import CfgNode


def common_defaults():
    """The defaults shared by all tasks, as a fresh mutable ``CfgNode``."""
    _C = CfgNode()

    # ---------------------------------------------------------------------------------------- #
    # Run
    # ---------------------------------------------------------------------------------------- #
    # Seed of python, numpy and torch RNGs; -1 leaves them unseeded.
    _C.RNG_SEED = -1
    # Output root, relative to --model-dir; runs go to <OUTPUT_PATH>/<cfg name>/<image set>_train.
    _C.OUTPUT_PATH = ''
    # Registered model class built by the task (e.g. 'ResNetVLBERT').
    _C.MODULE = ''
    # GPU ids as a comma string ('0,1,2,3'); informative: torchrun decides the devices.
    _C.GPUS = ''
    # Log a progress line every LOG_FREQUENT micro-batches.
    _C.LOG_FREQUENT = 50
    # Validate every VAL_FREQUENT epochs.
    _C.VAL_FREQUENT = 1
    # Write {MODEL_PREFIX}-{epoch:04d}.model every CHECKPOINT_FREQUENT epochs.
    _C.CHECKPOINT_FREQUENT = 1
    # File name prefix of checkpoints.
    _C.MODEL_PREFIX = ''
    # DataLoader worker processes per GPU (per process on CPU); 0 loads in the main process.
    _C.NUM_WORKERS_PER_GPU = 4
    # Image resize (short side, max long side) in pixels; () keeps the original size.
    _C.SCALES = ()

    # ---------------------------------------------------------------------------------------- #
    # Data set (a list of such mappings in multi-task pretraining)
    # ---------------------------------------------------------------------------------------- #
    _C.DATASET = CfgNode()
    # Data set name ('vcr', 'vqa', 'conceptual_captions', ...).
    _C.DATASET.DATASET = ''
    # Index of the label in the batch tuple; -1 means the last element.
    _C.DATASET.LABEL_INDEX_IN_BATCH = -1
    # Append the sample index to each batch (used to gather predictions).
    _C.DATASET.APPEND_INDEX = False
    # VCR sub-task: 'Q2A', 'QA2R' or 'Q2AR'.
    _C.DATASET.TASK = 'Q2AR'
    # Align words to boxes by basic tokenisation only (reference option for VCR).
    _C.DATASET.BASIC_ALIGN = False
    # Folder holding annotations and image sets (relative to the working directory).
    _C.DATASET.DATASET_PATH = ''
    # Root for cached files (database caches).
    _C.DATASET.ROOT_PATH = ''
    # Image set folder (or zip) names for each split.
    _C.DATASET.TRAIN_IMAGE_SET = ''
    _C.DATASET.VAL_IMAGE_SET = ''
    _C.DATASET.TEST_IMAGE_SET = ''
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

    # ---------------------------------------------------------------------------------------- #
    # Network
    # ---------------------------------------------------------------------------------------- #
    _C.NETWORK = CfgNode()
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
    # Pixel mean and std, BGR order, 0-255 scale.
    _C.NETWORK.PIXEL_MEANS = ()
    _C.NETWORK.PIXEL_STDS = ()
    # Boxes come with precomputed features instead of running the ResNet.
    _C.NETWORK.IMAGE_FEAT_PRECOMPUTED = False
    # ResNet weights prefix: loads {IMAGE_PRETRAINED}-{IMAGE_PRETRAINED_EPOCH:04d}.model; '' = random.
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

    # ---------------------------------------------------------------------------------------- #
    # Training
    # ---------------------------------------------------------------------------------------- #
    _C.TRAIN = CfgNode()
    # Extra param groups: [[name_substring, lr_multiplier], ...].
    _C.TRAIN.LR_MULT = []
    # LR multipliers and gradient clipping (-1 = off) of the learnable visual scales.
    _C.TRAIN.VISUAL_SCALE_TEXT_LR_MULT = 1.0
    _C.TRAIN.VISUAL_SCALE_OBJECT_LR_MULT = 1.0
    _C.TRAIN.VISUAL_SCALE_CLIP_GRAD_NORM = -1.0
    # Shuffle the training set each epoch.
    _C.TRAIN.SHUFFLE = True
    # Probability of a horizontal flip of a training sample.
    _C.TRAIN.FLIP_PROB = 0.5
    # Images per GPU per micro-batch (a list: one entry per data set).
    _C.TRAIN.BATCH_IMAGES = 1
    # Batch images of similar aspect ratio together.
    _C.TRAIN.ASPECT_GROUPING = True
    # Resume from the checkpoint of epoch BEGIN_EPOCH - 1.
    _C.TRAIN.RESUME = False
    # Resume from the newest complete checkpoint in the output folder, if any.
    _C.TRAIN.AUTO_RESUME = True
    # Epoch range [BEGIN_EPOCH, END_EPOCH).
    _C.TRAIN.BEGIN_EPOCH = 0
    _C.TRAIN.END_EPOCH = 0
    # 'SGD', 'Adam' or 'AdamW' (BERT style).
    _C.TRAIN.OPTIMIZER = 'SGD'
    # Max global gradient norm (after unscaling); <= 0 = no clipping.
    _C.TRAIN.CLIP_GRAD_NORM = -1.0
    # Micro-batches per optimizer step.
    _C.TRAIN.GRAD_ACCUMULATE_STEPS = 1
    # LR per sample: the optimizer's LR is LR x images per step over all GPUs.
    _C.TRAIN.LR = 0.1
    # 'step', 'triangle', 'cosine' (new) or 'plateau'.
    _C.TRAIN.LR_SCHEDULE = 'step'
    # (new) 'cosine': LR per sample (like LR) reached at the last optimizer step of END_EPOCH; each
    # param group ends at LR_MIN / LR of its base LR. Must be 0 with the other schedules.
    _C.TRAIN.LR_MIN = 0.0
    # 'step': LR multiplied by LR_FACTOR at each epoch of LR_STEP ("14,18" in YAML).
    _C.TRAIN.LR_FACTOR = 0.1
    _C.TRAIN.LR_STEP = ()
    # Warmup over WARMUP_STEPS optimizer steps from LR x WARMUP_FACTOR, 'linear' or 'constant'.
    _C.TRAIN.WARMUP = False
    _C.TRAIN.WARMUP_METHOD = 'linear'
    _C.TRAIN.WARMUP_FACTOR = 1.0 / 3
    _C.TRAIN.WARMUP_STEPS = 1000
    # (new) Label smoothing of softmax cross-entropy answer losses (VCR; VQA with ANS_LOSS_TYPE 'ce'),
    # in [0, 1]; a task without such a loss refuses a non-zero value. 0 = off (the reference's loss).
    _C.TRAIN.LABEL_SMOOTHING = 0.0
    # (new) Storage dtype of the Adam/AdamW moments: 'float32' or 'bfloat16' (half the state memory;
    # the update math and the weights stay fp32). SGD refuses 'bfloat16'.
    _C.TRAIN.OPTIM_STATE_DTYPE = 'float32'
    # Weight decay and SGD momentum.
    _C.TRAIN.WD = 0.0001
    _C.TRAIN.MOMENTUM = 0.9
    # Mixed precision: autocast forward with fp32 master params.
    _C.TRAIN.FP16 = False
    # Loss scale: a number (static) or 'dynamic'.
    _C.TRAIN.FP16_LOSS_SCALE = 128.0
    # (new) Autocast dtype when FP16 is on: 'float16' (loss scaling) or 'bfloat16' (no scaling).
    _C.TRAIN.FP16_DTYPE = 'float16'
    # (new) Stop with an error after this many consecutive skipped (inf/nan) optimizer steps.
    _C.TRAIN.MAX_CONSECUTIVE_SKIPS = 100
    # (new) Also checkpoint every CHECKPOINT_STEPS optimizer steps inside an epoch; 0 = off.
    _C.TRAIN.CHECKPOINT_STEPS = 0
    # (new) How many mid-epoch checkpoints to keep.
    _C.TRAIN.CHECKPOINT_KEEP = 2
    # (new) torch.compile backend of the model's forward ('inductor', 'aot_eager', ...); '' = eager
    # (default). If compiling fails, a warning names the cause and training goes on in eager mode.
    _C.TRAIN.COMPILE = ''
    # Losses logged by name: ("output_name", "DisplayName") pairs.
    _C.TRAIN.LOSS_LOGGERS = []

    # ---------------------------------------------------------------------------------------- #
    # Validation and test
    # ---------------------------------------------------------------------------------------- #
    _C.VAL = CfgNode()
    _C.VAL.SHUFFLE = False
    _C.VAL.FLIP_PROB = 0.0
    _C.VAL.BATCH_IMAGES = 1

    _C.TEST = CfgNode()
    _C.TEST.SHUFFLE = False
    _C.TEST.FLIP_PROB = 0.0
    # Epoch of the checkpoint to test.
    _C.TEST.TEST_EPOCH = 0
    _C.TEST.BATCH_IMAGES = 1
    return _C


# --------------------------------------------------------------------------------------------- #
# Reading YAML
# --------------------------------------------------------------------------------------------- #
