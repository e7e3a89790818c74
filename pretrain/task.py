"""The pretraining task: what VL-BERT pretraining adds to the shared engine (data sets, metrics, host metric).

Conceptual Captions (MLM with visual clues, masked RoI classification, caption-image relationship) and,
with a ``DATASET`` list, a text corpus for text-only MLM; the engine builds one loader per entry.
"""
from common.metrics.composite_eval_metric import CompositeEvalMetric
from common.metrics.loss_logger import loss_loggers
from common.modeling.vlbert_task import VLBertTask
from common.task import register_task
import pretrain.data  # noqa: F401  (registers 'conceptual_captions' and 'general_corpus')
from pretrain.function.config import VALUE_RULES, check_config, pretrain_defaults
from pretrain.function.metrics import (MLMAccuracy, MLMAccuracyAUX, MLMAccuracyWVC, MVRCAccuracy,
                                       RelationshipAccuracy)
from pretrain.modules import MODELS

MULTITASK_MODULE = "ResNetVLBERTForPretrainingMultitask"


class PretrainTask(VLBertTask):
    """VL-BERT pretraining (paper section 3.2); the best epoch is the one of the highest caption MLM accuracy."""
    name = "pretrain"
    onnx_refusal = ("a pretraining model is a start for fine-tuning, not a predictor: "
                    "fine-tune it and export that, or hand it on with --format safetensors")
    models = MODELS

    defaults = staticmethod(pretrain_defaults)

    def host_metric(self, cfg):
        """``MLMAccWVC`` for the multi-task model, else ``MLMAcc`` (the reference's choice)."""
        return "MLMAccWVC" if cfg.MODULE == MULTITASK_MODULE else "MLMAcc"

    def label_index_in_batch(self, cfg):
        """None: the pretraining models return their labels in the outputs."""
        return None

    def build_metrics(self, cfg, for_training):
        """The accuracies of the losses that are on (``RelAcc``, ``MLMAcc`` or ``MLMAccWVC`` + ``MLMAccAUX``,
        ``MVRCAccuracy``) plus the ``TRAIN.LOSS_LOGGERS`` losses, in training and validation (as the reference)."""
        net = cfg.NETWORK
        metrics = CompositeEvalMetric()
        if net.WITH_REL_LOSS:
            metrics.add(RelationshipAccuracy())
        if net.WITH_MLM_LOSS:
            for metric in ([MLMAccuracyWVC(), MLMAccuracyAUX()] if cfg.MODULE == MULTITASK_MODULE
                           else [MLMAccuracy()]):
                metrics.add(metric)
        if net.WITH_MVRC_LOSS:
            metrics.add(MVRCAccuracy())
        for metric in loss_loggers(cfg.TRAIN.LOSS_LOGGERS):
            metrics.add(metric)
        return metrics

    def predictor(self, cfg, ckpt, ckpt_path, device, feature_weights=None, box_source=None):
        """:class:`pretrain.predict.PretrainPredictor` (fills in the ``[MASK]`` words of a caption).

        Raises:
            common.errors.UserInputError: NETWORK.WITH_MLM_LOSS is off (the model has no MLM head to read).
        """
        if not cfg.NETWORK.WITH_MLM_LOSS:
            from common.errors import UserInputError
            raise UserInputError("NETWORK.WITH_MLM_LOSS is false: the model predicts no masked word")
        from pretrain.predict import PretrainPredictor
        return PretrainPredictor(self, cfg, ckpt_path, device, feature_weights, box_source)

    check_config = staticmethod(check_config)
    value_rules = VALUE_RULES


TASK = register_task(PretrainTask())
