"""Any timm image classifier as a task model: ``outputs, loss = model(image, label, index)``."""
import warnings

import timm
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy

from common.modeling.module import Module, RandomInitWarning
from common.modeling.timm_weights import arch_kwargs, load_timm_weights


class TimmClassifier(Module):
    """``timm.create_model(NETWORK.ARCH, num_classes=NETWORK.NUM_CLASSES, drop_path_rate=NETWORK.DROP_PATH_RATE,
    **NETWORK.ARCH_KWARGS)`` under ``backbone``, weights from ``NETWORK.IMAGE_PRETRAINED`` (a timm
    ``.safetensors`` / ``.pth`` state dict, read weights-only; a classifier of another class count stays
    random), gradient checkpointing from ``NETWORK.GRADIENT_CHECKPOINTING``.

    Training forward: ``image`` float ``[B, 3, S, S]``, ``label`` int64 ``[B]``, ``index`` (the data set's,
    not read) -> ``({'label_logits' [B, C], 'label' [B], 'cls_loss' 0-dim}, loss)``: softmax cross-entropy in
    fp32 with ``TRAIN.LABEL_SMOOTHING``, or, with ``TRAIN.MIXUP_ALPHA`` / ``CUTMIX_ALPHA`` > 0, timm's Mixup
    (smoothing included) and the soft-target cross-entropy. Inference: ``(image, index)`` -> ``{'label_logits'}``.

    Raises:
        RuntimeError: timm does not know ``NETWORK.ARCH``. common.modeling.timm_weights.TimmWeightsError: the
        pretrained file holds another architecture (:func:`common.modeling.timm_weights.load_timm_weights`).
    """

    def __init__(self, cfg):
        super().__init__(cfg)
        net, train = cfg.NETWORK, cfg.TRAIN
        self.backbone = timm.create_model(net.ARCH, pretrained=False, num_classes=net.NUM_CLASSES,
                                          drop_path_rate=net.DROP_PATH_RATE, **arch_kwargs(net.ARCH_KWARGS))
        if net.GRADIENT_CHECKPOINTING:
            self.backbone.set_grad_checkpointing(True)
        self.label_smoothing = train.LABEL_SMOOTHING
        self.mixup = None
        if train.MIXUP_ALPHA > 0 or train.CUTMIX_ALPHA > 0:
            self.mixup = Mixup(mixup_alpha=train.MIXUP_ALPHA, cutmix_alpha=train.CUTMIX_ALPHA,
                               label_smoothing=train.LABEL_SMOOTHING, num_classes=net.NUM_CLASSES)
        self.init_weight()

    def init_weight(self):
        path = self.cfg.NETWORK.IMAGE_PRETRAINED
        if not path:
            warnings.warn(RandomInitWarning("the timm model {} starts from random weights (NETWORK.IMAGE_PRETRAINED "
                                            "is empty)".format(self.cfg.NETWORK.ARCH), self.backbone))
            return
        head = load_timm_weights(self.backbone, path, self.cfg.NETWORK.ARCH)
        if head:
            warnings.warn(RandomInitWarning("{} stay random: their shapes in {} are for another class count"
                                            .format(", ".join(head), path)))

    def train_forward(self, image, label, index):
        if self.mixup is not None:
            image, target = self.mixup(image, label)
            logits = self.backbone(image)
            loss = SoftTargetCrossEntropy()(logits.float(), target)
        else:
            logits = self.backbone(image)
            loss = F.cross_entropy(logits.float(), label, label_smoothing=self.label_smoothing)
        return {"label_logits": logits, "label": label, "cls_loss": loss}, loss

    def inference_forward(self, image, index):
        return {"label_logits": self.backbone(image)}
