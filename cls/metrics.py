"""cls metrics: top-k accuracy and the mean cross-entropy of the logits (summed over ranks)."""
import torch
import torch.nn.functional as F

from common.metrics.eval_metric import EvalMetric


class TopKAccuracy(EvalMetric):
    """Fraction of images whose label is among the ``k`` highest ``outputs['label_logits']`` ``[N, C]``
    (``outputs['label']`` ``[N]`` int64); with fewer than ``k`` classes every image counts as right."""

    def __init__(self, k=1, name="Acc", allreduce=True):
        self.k = k
        super().__init__(name, allreduce)

    def update(self, outputs):
        with torch.no_grad():
            logits, label = outputs["label_logits"], outputs["label"]
            top = logits.topk(min(self.k, logits.shape[1]), dim=1).indices
            self.sum_metric = self.sum_metric + (top == label[:, None]).any(1).sum()
            self.num_inst = self.num_inst + label.shape[0]


class CrossEntropy(EvalMetric):
    """Mean softmax cross-entropy (nats, no label smoothing) of ``label_logits`` against ``label``: the
    validation loss that early stopping can watch."""

    def __init__(self, name="Loss", allreduce=True):
        super().__init__(name, allreduce)

    def update(self, outputs):
        with torch.no_grad():
            logits, label = outputs["label_logits"], outputs["label"]
            self.sum_metric = self.sum_metric + F.cross_entropy(logits.float(), label, reduction="sum").double()
            self.num_inst = self.num_inst + label.shape[0]
