"""The config keys every task reads (run, data loading, training, evaluation), with their defaults,
meanings and units.

Key names and default values are those of the reference release (github jackroos/VL-BERT,
``*/function/config.py``) so that its paper YAML files load unchanged. Keys we added are marked
``(new)``. A model family adds its keys (``common.modeling.vlbert_config.add_vlbert_config``), and
each task's ``<task>/function/config.py`` adds its own, as detectron2's ``add_pointrend_config`` does.
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
    # Log a progress line every LOG_FREQUENT micro-batches (and write TensorBoard at the steps holding them).
    _C.LOG_FREQUENT = 50
    # Where a training run reports its figures, besides the log: any of 'tensorboard', 'mlflow', 'wandb'
    # (docs/tracking.md); rank 0 reports.
    _C.REPORT_TO = ['tensorboard']
    # Seconds a collective waits for its peers before it raises (the process group's timeout): bounds how long
    # the ranks wait for a node that went silent (docs/slurm.md#faults-between-nodes). Long enough for a
    # rank-0-only step (saving a large checkpoint, evaluating) between two collectives.
    _C.DIST_TIMEOUT_S = 1800
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
    # Pad the images of a batch to its largest image instead of the fixed SCALES canvas (short x
    # long, turned to each image's orientation; the VCR release's FixPadding). Faster when the
    # images are smaller than the canvas, but an image's features near its bottom and right
    # borders, hence its logits, then depend on the other images of its batch (batch size and
    # order change evaluation results). The reference's VQA, RefCOCO+ and pretraining loaders
    # padded this way. With SCALES empty images are always padded to the batch maximum.
    _C.DATASET.PAD_TO_BATCH_MAX = False
    # Folder holding annotations and image sets (relative to the working directory).
    _C.DATASET.DATASET_PATH = ''
    # Image set folder (or zip) names for each split.
    _C.DATASET.TRAIN_IMAGE_SET = ''
    _C.DATASET.VAL_IMAGE_SET = ''
    _C.DATASET.TEST_IMAGE_SET = ''
    # (new) Read images and per-image JSON from LMDB stores packed by tools/pack_lmdb.py: where
    # DATASET.ZIP_MODE reads 'x.zip@/inner/path', read 'x.lmdb@/inner/path' (data/PREPARE_DATA.md, "LMDB").
    # Not with ZIP_MODE.
    _C.DATASET.LMDB_MODE = False

    # ---------------------------------------------------------------------------------------- #
    # Network: the image normalisation of the shared transforms; each model adds its keys
    # ---------------------------------------------------------------------------------------- #
    _C.NETWORK = CfgNode()
    # Pixel mean and std, BGR order, 0-255 scale.
    _C.NETWORK.PIXEL_MEANS = ()
    _C.NETWORK.PIXEL_STDS = ()

    # ---------------------------------------------------------------------------------------- #
    # Training
    # ---------------------------------------------------------------------------------------- #
    _C.TRAIN = CfgNode()
    # Extra param groups: [[name_substring, lr_multiplier], ...].
    _C.TRAIN.LR_MULT = []
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
    # (new) Data parallelism over the processes: 'ddp' (every rank holds the whole model) or 'fsdp' (FSDP2:
    # parameters, gradients and optimizer state sharded over the ranks; docs/fsdp.md).
    _C.TRAIN.STRATEGY = 'ddp'
    # (new) 'fsdp' only: write the sharded checkpoints in the background (dcp.async_save); training goes on
    # once the shards are copied to host memory.
    _C.TRAIN.ASYNC_CHECKPOINT = False
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
    # (new) [START_STEP, NUM_STEPS]: write a torch.profiler trace of those optimizer steps to the run folder's
    # profile/ folder (steps counted from 1); [] = off.
    _C.TRAIN.PROFILE = []
    # (new) Also checkpoint every CHECKPOINT_STEPS optimizer steps inside an epoch; 0 = off.
    _C.TRAIN.CHECKPOINT_STEPS = 0
    # (new) How many mid-epoch checkpoints to keep.
    _C.TRAIN.CHECKPOINT_KEEP = 2
    # (new) Also checkpoint every CHECKPOINT_EVERY_FRACTION of the run's optimizer steps (0.2: 5 times, at
    # 20%, 40%, ...), kept like CHECKPOINT_STEPS files; 0 = off.
    _C.TRAIN.CHECKPOINT_EVERY_FRACTION = 0.0
    # (new) Model EMA (timm ModelEmaV3) decay per optimizer step, in (0, 1); validated after each epoch
    # (Val-EMA-*) and written to {MODEL_PREFIX}-ema.model. 0 = off.
    _C.TRAIN.EMA_DECAY = 0.0
    # (new) Early stopping on the validation metric EARLY_STOP_METRIC ('Loss', 'Acc', ...; '' = off):
    # stop after EARLY_STOP_PATIENCE validations without improvement ('min': lower is better, 'max').
    _C.TRAIN.EARLY_STOP_METRIC = ''
    _C.TRAIN.EARLY_STOP_MODE = 'min'
    _C.TRAIN.EARLY_STOP_PATIENCE = 10
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
