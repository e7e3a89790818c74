"""VCR training: the shared engine with the VCR model registry and metrics."""
from common.engine import Task, train_net as _train_net
from common.metrics.composite_eval_metric import CompositeEvalMetric
from common.metrics.vcr_metrics import Accuracy, LossLogger
import vcr.data  # noqa: F401  (registers the 'vcr' dataset)
from vcr.function.config import check_config
from vcr.modules import build_model


def build_metrics(cfg, for_training):
    """Q->A (or QA->R) accuracy 'Acc', plus the TRAIN.LOSS_LOGGERS losses while training.

    The CNN regularisation loss is logged only when the model computes it (ENABLE_CNN_REG_LOSS).
    """
    metrics = CompositeEvalMetric([Accuracy("Acc")])
    if for_training:
        for output_name, display_name in cfg.TRAIN.LOSS_LOGGERS:
            if output_name == "cnn_regularization_loss" and not cfg.NETWORK.ENABLE_CNN_REG_LOSS:
                continue
            metrics.add(LossLogger(output_name, display_name))
    return metrics


VCR_TASK = Task(build_model=build_model, build_metrics=build_metrics, host_metric_name="Acc",
                check_config=check_config)


def train_net(args, cfg):
    """Train a VCR model (reference ``vcr.function.train.train_net``); returns (rank, model)."""
    return _train_net(args, cfg, VCR_TASK)
