"""The VCR task: what VCR adds to the shared engine (metrics, result CSV; the pretrain key renames sit next
to the model, in vcr/modules/resnet_vlbert_for_vcr.py)."""
import functools
import os

from common.metrics.composite_eval_metric import CompositeEvalMetric
from common.metrics.loss_logger import loss_loggers
from common.modeling.vlbert_task import VLBertTask
from common.task import register_task
import vcr.data  # noqa: F401  (registers the 'vcr' dataset)
from vcr.function.config import VALUE_RULES, check_config, vcr_defaults
from vcr.function.metrics import Accuracy
from vcr.function.test import TestProbabilities
from vcr.modules import MODELS
from vcr.modules.resnet_vlbert_for_vcr import pretrain_renames

class VCRTask(VLBertTask):
    """Visual Commonsense Reasoning: Q->A or QA->R as 4-way multiple choice (DATASET.TASK)."""
    name = "vcr"
    onnx_refusal = ("its graph (four question-answer pairs per sample with per-token grounding tags) is not "
                    "declared; use --format safetensors")
    models = MODELS

    defaults = staticmethod(vcr_defaults)

    def build_metrics(self, cfg, for_training):
        """Q->A (or QA->R) accuracy 'Acc', plus the TRAIN.LOSS_LOGGERS losses while training.

        The CNN regularisation loss is logged only when the model computes it (ENABLE_CNN_REG_LOSS).
        """
        metrics = CompositeEvalMetric([Accuracy("Acc")])
        if for_training:
            skip = () if cfg.NETWORK.ENABLE_CNN_REG_LOSS else ("cnn_regularization_loss",)
            for metric in loss_loggers(cfg.TRAIN.LOSS_LOGGERS, skip):
                metrics.add(metric)
        return metrics

    check_config = staticmethod(check_config)
    value_rules = VALUE_RULES

    def pretrain_renames(self, cfg):
        return functools.partial(pretrain_renames, segmb_init=cfg.NETWORK.PARTIAL_PRETRAIN_SEGMB_INIT,
                                 load_rel_head=cfg.NETWORK.LOAD_REL_HEAD)

    def predictor(self, cfg, ckpt, ckpt_path, device, feature_weights=None, box_source=None):
        """:class:`vcr.predict.VCRPredictor` (boxes from the input, else from ``box_source``)."""
        from vcr.predict import VCRPredictor
        return VCRPredictor(cfg, device, box_source)

    def test_evaluator(self, cfg, dataset, save_path, save_name):
        """Writes ``{save_path}/{save_name}_test_result_{TASK}.csv`` (the leaderboard format).

        Raises:
            ValueError: DATASET.TASK is not 'Q2A' or 'QA2R' (a Q2AR file merges the two).
        """
        task = cfg.DATASET.TASK
        if task not in ("Q2A", "QA2R"):
            raise ValueError("DATASET.TASK: the test CSV is written per task, 'Q2A' or 'QA2R', got {!r}".format(task))
        return TestProbabilities(task, dataset, os.path.join(save_path, "{}_test_result_{}.csv".format(save_name, task)))


TASK = register_task(VCRTask())
