"""RefCOCO+ config (reference ``refcoco/function/config.py``).

The data set (``refcoco.data``), the model (``refcoco.modules``) and the metric (``refcoco.metrics``)
read these keys; the training, validation and test entry points are not wired yet.
"""
from common.config import common_defaults, task_api
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
