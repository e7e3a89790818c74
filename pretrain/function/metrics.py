"""Pretraining metrics with the reference's names: ``RelAcc``, ``MLMAcc``, ``MLMAccWVC``, ``MLMAccAUX``,
``MVRCAccuracy``. Each reads the model's outputs dict; a task that is off (its logits None) adds nothing.
Sums stay tensors on the outputs' device; nothing here waits for the GPU.
"""
from common.metrics.eval_metric import EvalMetric

from ..data.masking import IGNORE


class RelationshipAccuracy(EvalMetric):
    """Share of samples whose caption-image relationship (``relationship_logits`` ``(B, 2)``) is
    predicted right (``relationship_label`` ``(B,)``, 1 = matching caption)."""

    def __init__(self, allreduce=True):
        super().__init__("RelAcc", allreduce)

    def update(self, outputs):
        logits = outputs.get("relationship_logits")
        if logits is None:
            return
        label = outputs["relationship_label"]
        keep = label >= 0  # a negative label is ignored (see ConceptualCaptionsDataset.ignored_labels)
        self.sum_metric = self.sum_metric + (logits.detach().argmax(1)[keep] == label[keep]).sum()
        self.num_inst = self.num_inst + keep.sum()


class MLMAccuracy(EvalMetric):
    """Share of predicted word pieces (label != -1) whose argmax is the original piece.

    Reads ``mlm_logits<suffix>`` ``(B, L, vocab)`` and ``mlm_label<suffix>`` ``(B, L)`` int64.
    """
    suffix, metric_name = "", "MLMAcc"

    def __init__(self, allreduce=True):
        super().__init__(self.metric_name, allreduce)

    def update(self, outputs):
        logits = outputs.get("mlm_logits" + self.suffix)
        if logits is None:
            return
        label = outputs["mlm_label" + self.suffix]
        keep = label != IGNORE
        self.sum_metric = self.sum_metric + (logits.detach()[keep].argmax(1) == label[keep]).sum()
        self.num_inst = self.num_inst + keep.sum()


class MLMAccuracyWVC(MLMAccuracy):
    """MLM accuracy on the image-caption samples (MLM with visual clues) of the multi-task model."""
    suffix, metric_name = "_wvc", "MLMAccWVC"


class MLMAccuracyAUX(MLMAccuracy):
    """MLM accuracy on the text-only corpus samples of the multi-task model."""
    suffix, metric_name = "_aux", "MLMAccAUX"


class MVRCAccuracy(EvalMetric):
    """Share of predicted regions whose argmax class is the detector's most likely class.

    Reads ``mvrc_logits`` ``(B, N, C)`` and ``mvrc_label`` ``(B, N, C)``; a region is predicted when its
    target is a distribution (row sum within 0.1 of 1, the reference's test), not an all-zero row.
    """

    def __init__(self, allreduce=True):
        super().__init__("MVRCAccuracy", allreduce)

    def update(self, outputs):
        logits = outputs.get("mvrc_logits")
        if logits is None:
            return
        label = outputs["mvrc_label"]
        keep = (label.sum(2) - 1.0).abs() < 0.1
        self.sum_metric = self.sum_metric + (logits.detach()[keep].argmax(1) == label[keep].argmax(1)).sum()
        self.num_inst = self.num_inst + keep.sum()
