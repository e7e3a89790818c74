"""VCR metrics on the model's outputs dict: Q->A / QA->R accuracy, Q->AR joint accuracy.

Names follow the reference release (``Acc``, ``JointAcc``), so log lines and
``ValidationMonitor(host_metric_name='Acc')`` match.
Sums stay tensors on the outputs' device; nothing here waits for the GPU.
"""
import torch

from common.metrics.eval_metric import EvalMetric


def _correct(logits, label):
    """Number of rows whose argmax equals ``label``; rows labelled -1 are ignored.

    Args:
        logits: ``(N, C)`` scores, or ``(N * C,)`` per-candidate scores with ``label`` one-hot
            ``(N * C,)`` (the reference's binary-classification layout, C = 4).
        label: ``(N,)`` int64 choice index, or one-hot as above.
    Returns:
        (correct, count): 0-dim tensor and int.
    """
    if logits.dim() == 1:
        logits, label = logits.view(-1, 4), label.view(-1, 4)
        keep = (label != -1).all(1)
        logits, label = logits[keep], label[keep].argmax(1)
    else:
        keep = label != -1
        logits, label = logits[keep], label[keep]
    return (logits.argmax(1) == label).sum(), label.shape[0]


class Accuracy(EvalMetric):
    """Fraction of questions whose highest-scoring candidate is the labelled one.

    Reads ``outputs['label_logits']`` (N, 4) and ``outputs['label']`` (N,): Q->A accuracy on
    a Q2A model, QA->R accuracy on a QA2R model.
    """

    def __init__(self, name="Acc", allreduce=True):
        super().__init__(name, allreduce)

    def update(self, outputs):
        with torch.no_grad():
            correct, count = _correct(outputs["label_logits"], outputs["label"])
            self.sum_metric = self.sum_metric + correct
            self.num_inst = self.num_inst + count


class JointAccuracy(EvalMetric):
    """Q->AR accuracy: both the answer and the rationale right.

    Reads ``answer_label_logits`` / ``answer_label`` and ``rationale_label_logits`` /
    ``rationale_label`` ((N, 4) / (N,) each; the same N questions in the same order).
    """

    def __init__(self, name="JointAcc", allreduce=True):
        super().__init__(name, allreduce)

    def update(self, outputs):
        with torch.no_grad():
            a = outputs["answer_label_logits"].argmax(1) == outputs["answer_label"]
            r = outputs["rationale_label_logits"].argmax(1) == outputs["rationale_label"]
            self.sum_metric = self.sum_metric + (a & r).sum()
            self.num_inst = self.num_inst + a.shape[0]
