"""The VCR task: what VCR adds to the shared engine (metrics, pretrain key renames, result CSV)."""
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

# Pretraining relationship head (the reference's spelling) and the VCR classifier it becomes.
REL_HEAD = "vlbert.relationsip_head.caption_image_relationship"
VCR_CLASSIFIER = "final_mlp.1"
TOKEN_TYPE_EMBEDDINGS = "vlbert._module.token_type_embeddings.weight"


def pretrain_renames(parsed, raw, source, segmb_init=False, load_rel_head=False):
    """VCR's renames of a pretraining state dict, after the prefix changes (as the reference did).

    * ``load_rel_head`` and a relationship head in the file: the VCR classifier ``final_mlp.1``
      gets ``W[1:2] - W[0:1]`` and ``b[1:2] - b[0:1]`` of the 2-way caption-image head (the logit
      difference of "matched" over "not matched").
    * ``segmb_init``: row 1 of the token-type embeddings copies row 0.

    Args:
        parsed: renamed fp32 tensors; raw: the file's tensors (``module.`` removed); source: file name.
    Returns:
        ``parsed`` with the changes above.
    Raises:
        common.checkpoint.CheckpointError: ``segmb_init`` but no token-type embeddings after renaming.
    """
    from common.checkpoint import CheckpointError

    if load_rel_head and REL_HEAD + ".weight" in raw:
        for suffix in (".weight", ".bias"):
            w = raw[REL_HEAD + suffix].float()
            parsed[VCR_CLASSIFIER + suffix] = w[1:2] - w[0:1]
    if segmb_init:
        if TOKEN_TYPE_EMBEDDINGS not in parsed:
            raise CheckpointError("NETWORK.PARTIAL_PRETRAIN_SEGMB_INIT: {} has no {} after the prefix changes"
                                  .format(source, TOKEN_TYPE_EMBEDDINGS))
        emb = parsed[TOKEN_TYPE_EMBEDDINGS].clone()
        emb[1] = emb[0]
        parsed[TOKEN_TYPE_EMBEDDINGS] = emb
    return parsed


class VCRTask(VLBertTask):
    """Visual Commonsense Reasoning: Q->A or QA->R as 4-way multiple choice (DATASET.TASK)."""
    name = "vcr"
    models = MODELS
    host_metric_name = "Acc"

    def defaults(self):
        return vcr_defaults()

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
