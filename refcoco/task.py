"""The RefCOCO+ task: what referring expressions add to the shared engine (metrics, result JSON)."""
import os

from common.metrics.composite_eval_metric import CompositeEvalMetric
from common.metrics.loss_logger import loss_loggers
from common.modeling.vlbert_task import VLBertTask
from common.task import register_task
import refcoco.data  # noqa: F401  (registers the 'refcoco+' dataset)
from refcoco.data.refcoco import DATASET_NAME, split_referred_boxes
from refcoco.function.config import VALUE_RULES, check_config, refcoco_defaults
from refcoco.function.test import ResultJSON
from refcoco.metrics import ChosenBoxPositive, RefAccuracy
from refcoco.modules import MODELS


class RefCOCOTask(VLBertTask):
    """RefCOCO+: which candidate box does the expression refer to (one logit per box, BCE)."""
    name = "refcoco"
    onnx_refusal = ("its graph (one score per candidate box of the expression) is not declared; "
                    "use --format safetensors")
    models = MODELS
    host_metric_name = "RefAcc"

    defaults = staticmethod(refcoco_defaults)

    def build_metrics(self, cfg, for_training):
        """Validation: ``RefAcc``, the accuracy over every expression of ``DATASET.VAL_IMAGE_SET`` (argmax box
        with IoU >= 0.5 with the referred box, original pixels; summed over ranks). Training: ``RefAcc``, the
        argmax box is a positive candidate (the reference's training metric), plus the TRAIN.LOSS_LOGGERS."""
        if not for_training:
            return CompositeEvalMetric([RefAccuracy(split_referred_boxes(cfg.DATASET.DATASET_PATH,
                                                                         cfg.DATASET.VAL_IMAGE_SET))])
        metrics = CompositeEvalMetric([ChosenBoxPositive("RefAcc")])
        for metric in loss_loggers(cfg.TRAIN.LOSS_LOGGERS):
            metrics.add(metric)
        return metrics

    check_config = staticmethod(check_config)
    value_rules = VALUE_RULES

    def predictor(self, cfg, ckpt, ckpt_path, device, feature_weights=None, box_source=None):
        """:class:`refcoco.predict.RefCOCOPredictor` (candidates from the input, else from ``box_source``)."""
        from refcoco.predict import RefCOCOPredictor
        return RefCOCOPredictor(cfg, device, box_source)

    def test_evaluator(self, cfg, dataset, save_path, save_name):
        """Writes ``{save_path}/{save_name}_refcoco+_{TEST_IMAGE_SET}.json`` (the reference's name and rows, see
        :func:`refcoco.function.test.write_result_json`) and prints the accuracy per split (test labels are public)."""
        return ResultJSON(dataset, os.path.join(save_path, "{}_{}_{}.json".format(save_name, DATASET_NAME,
                                                                                  cfg.DATASET.TEST_IMAGE_SET)))


TASK = register_task(RefCOCOTask())
