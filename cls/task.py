"""The image-classification task: any timm model on CIFAR-10/100 or an ImageFolder tree."""
import os

from common.metrics.composite_eval_metric import CompositeEvalMetric
from common.metrics.loss_logger import loss_loggers
from common.task import Input, Task, register_task
import cls.data  # noqa: F401  (registers 'cifar10', 'cifar100', 'imagefolder')
from cls.function.config import VALUE_RULES, check_config, cls_defaults, mixes
from cls.function.onnx import cls_onnx_graph
from cls.function.test import PredictionsCSV
from cls.metrics import CrossEntropy, TopKAccuracy
from cls.modules import MODELS


class ClsTask(Task):
    """Image classification: softmax cross-entropy over ``NETWORK.NUM_CLASSES``; the best epoch is the
    best top-1 accuracy ``Acc``."""
    name = "cls"
    models = MODELS
    host_metric_name = "Acc"
    value_rules = VALUE_RULES
    onnx_refusal = None
    check_config = staticmethod(check_config)

    def defaults(self):
        return cls_defaults()

    def inputs(self, cfg):
        """The data folder, and the ``NETWORK.IMAGE_PRETRAINED`` file when set."""
        found = super().inputs(cfg)
        if cfg.NETWORK.IMAGE_PRETRAINED:
            found.append(Input("NETWORK.IMAGE_PRETRAINED", "timm weights", cfg.NETWORK.IMAGE_PRETRAINED))
        return found

    def model_title(self, cfg):
        """The timm model and its job, e.g. ``vit_base_patch16_224 classifier``."""
        return "{} classifier".format(cfg.NETWORK.ARCH)

    def train_batch_multiple(self, cfg):
        """2 with Mixup / CutMix (timm's ``Mixup`` mixes a batch with its reverse: an even batch), else 1."""
        if mixes(cfg):
            return 2, "timm's Mixup / CutMix (TRAIN.MIXUP_ALPHA, TRAIN.CUTMIX_ALPHA) needs an even batch"
        return 1, ""

    def label_index_in_batch(self, cfg):
        """The ``label`` field (the batch ends with ``index``)."""
        return "label"

    def build_metrics(self, cfg, for_training):
        """Top-1 ``Acc`` and ``Top5Acc``; validation adds the mean cross-entropy ``Loss``, training the
        TRAIN.LOSS_LOGGERS."""
        metrics = CompositeEvalMetric([TopKAccuracy(1, "Acc"), TopKAccuracy(5, "Top5Acc")])
        extra = loss_loggers(cfg.TRAIN.LOSS_LOGGERS) if for_training else [CrossEntropy("Loss")]
        for metric in extra:
            metrics.add(metric)
        return metrics

    def run_info(self, cfg, dataset):
        """The class names of the training data set (``classes``, label order), which a predictor prints."""
        return {"classes": list(dataset.classes)} if dataset is not None else {}

    def predictor(self, cfg, ckpt, ckpt_path, device, feature_weights=None, box_source=None):
        """:class:`cls.predict.ClsPredictor` (images only: no boxes, no features)."""
        from cls.predict import ClsPredictor
        return ClsPredictor(cfg, ckpt, ckpt_path, device)

    def test_evaluator(self, cfg, dataset, save_path, save_name):
        """Writes ``{save_path}/{save_name}_{DATASET.DATASET}_{TEST_IMAGE_SET}.csv`` (:class:`PredictionsCSV`)."""
        return PredictionsCSV(dataset, os.path.join(save_path, "{}_{}_{}.csv".format(
            save_name, cfg.DATASET.DATASET, cfg.DATASET.TEST_IMAGE_SET)))

    def onnx_graph(self, cfg, model):
        """``image`` [batch, 3, S, S] -> ``label_logits`` [batch, C] (:func:`cls.function.onnx.cls_onnx_graph`)."""
        return cls_onnx_graph(cfg, model)


TASK = register_task(ClsTask())
