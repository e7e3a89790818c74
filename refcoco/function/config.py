"""RefCOCO+ config (reference ``refcoco/function/config.py``).

The data set (``refcoco.data``), the model (``refcoco.modules``) and the metric (``refcoco.metrics``)
read these keys; the training, validation and test entry points are not wired yet.
"""
from common.config import common_defaults, task_api
from common.config_keys import key_checker, leaf_keys, refused, task_key_status
from vqa.function.config import add_answer_vocab_keys


def refcoco_defaults():
    """Defaults of the RefCOCO+ task as a fresh mutable CfgNode."""
    _C = add_answer_vocab_keys(common_defaults())
    # Boxes of each split: "gt" (ground truth) or "proposal" (detections).
    _C.DATASET.TRAIN_BOXES = "gt"
    _C.DATASET.VAL_BOXES = "gt"
    _C.DATASET.TEST_BOXES = "gt"
    # Detections of "proposal" boxes: "official" (MAttNet) or "vg".
    _C.DATASET.PROPOSAL_SOURCE = 'official'
    del _C.NETWORK['FOR_MASK_VL_MODELING_PRETRAIN']
    _C.NETWORK.ENABLE_CNN_REG_LOSS = False
    _C.TRAIN.LOSS_LOGGERS = [('cls_loss', 'ClsLoss')]
    return _C


config, update_config, load_config = task_api(refcoco_defaults)

# No RefCOCO+ model, data or training: no key has an effect, and any value other than the default is refused.
KEY_STATUS = task_key_status(refcoco_defaults(), {
    key: refused("the RefCOCO+ task is not in this release (only its config files load)")
    for key, _ in leaf_keys(refcoco_defaults())})


check_config = key_checker(refcoco_defaults, KEY_STATUS)
