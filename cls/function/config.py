"""Image-classification (cls) config: the shared keys plus the timm model and the recipe's augmentation.

The data set (``cls.data``), the model (``cls.modules``) and the metrics (``cls.metrics``) read these keys;
``KEY_STATUS`` says what each key does here (see :mod:`common.config.keys`).
"""
from common.config import common_defaults, task_rules
from common.config.keys import DONE, key_checker, refused, task_key_status, warned
from common.config.values import PROBABILITY, Rule, int_at_least, number_at_least


def cls_defaults():
    """Defaults of the cls task as a fresh mutable CfgNode."""
    _C = common_defaults()
    _C.MODULE = 'TimmClassifier'
    # 'cifar10', 'cifar100' (the "python version" pickles) or 'imagefolder' (<split>/<class>/<image>).
    _C.DATASET.DATASET = 'cifar100'
    # Side in pixels of the square images the model sees (crop or resize).
    _C.DATASET.IMAGE_SIZE = 224
    # timm model name and extra timm.create_model keyword arguments, [[name, value], ...]
    # (e.g. [[img_size, 32], [patch_size, 4], [embed_dim, 192], [depth, 6], [num_heads, 3]]).
    _C.NETWORK.ARCH = 'vit_base_patch16_224'
    _C.NETWORK.ARCH_KWARGS = []
    _C.NETWORK.NUM_CLASSES = 100
    # Stochastic depth rate of timm's models.
    _C.NETWORK.DROP_PATH_RATE = 0.0
    # timm weights file (.safetensors or .pth state dict); '' = random init.
    _C.NETWORK.IMAGE_PRETRAINED = ''
    # Recompute the blocks' activations in the backward (timm set_grad_checkpointing): less memory, more time.
    _C.NETWORK.GRADIENT_CHECKPOINTING = False
    # ImageNet mean and std (BGR, 0-255, as the shared keys).
    _C.NETWORK.PIXEL_MEANS = (103.53, 116.28, 123.675)
    _C.NETWORK.PIXEL_STDS = (57.375, 57.12, 58.395)
    # Square images: no aspect grouping.
    _C.TRAIN.ASPECT_GROUPING = False
    # RandomResizedCrop (min, max) area fraction; () = resize the whole image.
    _C.TRAIN.RRC_SCALE = ()
    # torchvision TrivialAugmentWide (the guide's AutoAugment(policy='ta_wide'), which torchvision lacks).
    _C.TRAIN.TRIVIAL_AUGMENT = False
    # timm RandomErasing probability at the first and at the last epoch (linear in between); (0, 0) = off.
    _C.TRAIN.RANDOM_ERASING_PROB = (0.0, 0.0)
    # timm Mixup / CutMix alphas; 0 = off (both 0: no Mixup). TRAIN.BATCH_IMAGES must then be even; an odd
    # last batch of an epoch is dropped.
    _C.TRAIN.MIXUP_ALPHA = 0.0
    _C.TRAIN.CUTMIX_ALPHA = 0.0
    _C.TRAIN.LOSS_LOGGERS = [('cls_loss', 'ClsLoss')]
    _C.DATASET.TRAIN_IMAGE_SET = 'train'
    _C.DATASET.VAL_IMAGE_SET = 'test'
    _C.DATASET.TEST_IMAGE_SET = 'test'
    return _C


_PAIR = Rule(lambda v, get: len(v) == 2 and 0 <= v[0] <= v[1] <= 1, lambda get: "[low, high] with 0 <= low <= high <= 1")
_EMPTY_OR_PAIR = Rule(lambda v, get: len(v) == 0 or _PAIR.ok(v, get), lambda get: "[] or " + _PAIR.expected(get))

def mixes(cfg):
    """Whether the config trains with timm's Mixup or CutMix (either alpha > 0)."""
    return cfg.TRAIN.MIXUP_ALPHA > 0 or cfg.TRAIN.CUTMIX_ALPHA > 0


# timm's Mixup mixes each sample with the one at the mirrored position of its batch: even batches only.
_MIX_KEYS = ("TRAIN.MIXUP_ALPHA", "TRAIN.CUTMIX_ALPHA")
_BATCH_IMAGES = Rule(
    lambda v, get: all(n >= 1 and (n % 2 == 0 or not any(get(k) > 0 for k in _MIX_KEYS))
                       for n in (v if isinstance(v, (list, tuple)) else [v])),
    lambda get: "an even int >= 1 (TRAIN.MIXUP_ALPHA {}, TRAIN.CUTMIX_ALPHA {}: timm's Mixup / CutMix mixes "
                "pairs)".format(*map(get, _MIX_KEYS)) if any(get(k) > 0 for k in _MIX_KEYS) else "an int >= 1",
    _MIX_KEYS)

# Valid values of the keys the cls data set and model read (common.config.values).
VALUE_RULES = task_rules({
    "TRAIN.BATCH_IMAGES": _BATCH_IMAGES,
    "DATASET.IMAGE_SIZE": int_at_least(1),
    "NETWORK.NUM_CLASSES": int_at_least(1),
    "NETWORK.DROP_PATH_RATE": PROBABILITY,
    "TRAIN.RRC_SCALE": _EMPTY_OR_PAIR,
    "TRAIN.RANDOM_ERASING_PROB": Rule(lambda v, get: len(v) == 2 and all(0 <= p <= 1 for p in v),
                                      lambda get: "[start, end], two probabilities"),
    "TRAIN.MIXUP_ALPHA": number_at_least(0),
    "TRAIN.CUTMIX_ALPHA": number_at_least(0),
})

_NO_BOXES = "cls images have no boxes or text; the shared image transforms that read it are not used"

KEY_STATUS = task_key_status(cls_defaults(), {
    "DATASET.IMAGE_SIZE": DONE,
    "DATASET.APPEND_INDEX": refused("the cls batch already carries the sample index (its 'index' field)"),
    "DATASET.PAD_TO_BATCH_MAX": warned("cls images all have DATASET.IMAGE_SIZE pixels; " + _NO_BOXES),
    "SCALES": warned("cls images are resized to DATASET.IMAGE_SIZE; " + _NO_BOXES),
    "NETWORK.ARCH": DONE,
    "NETWORK.ARCH_KWARGS": DONE,
    "NETWORK.NUM_CLASSES": DONE,
    "NETWORK.DROP_PATH_RATE": DONE,
    "NETWORK.IMAGE_PRETRAINED": DONE,
    "NETWORK.GRADIENT_CHECKPOINTING": DONE,
    "TRAIN.ASPECT_GROUPING": refused("cls images are square (DATASET.IMAGE_SIZE): there is no aspect ratio to group"),
    "TRAIN.RRC_SCALE": DONE,
    "TRAIN.TRIVIAL_AUGMENT": DONE,
    "TRAIN.RANDOM_ERASING_PROB": DONE,
    "TRAIN.MIXUP_ALPHA": DONE,
    "TRAIN.CUTMIX_ALPHA": DONE,
    "VAL.FLIP_PROB": warned("evaluation images are not flipped in cls"),
    "TEST.FLIP_PROB": warned("test images are not flipped in cls"),
})

check_config = key_checker(cls_defaults, KEY_STATUS)
