"""VQA metric on the model's outputs dict: the soft accuracy of the top answer (the reference's
``SoftAcc``, the name ``ValidationMonitor`` picks the best epoch by)."""
import torch

from common.metrics.eval_metric import EvalMetric


class SoftAccuracy(EvalMetric):
    """Mean, over questions, of the soft score (``label``) of the highest-scoring answer.

    With the targets of :func:`vqa.data.answers.soft_scores` this is the official VQA accuracy of the
    predicted answer, and a question whose answers are all outside the vocabulary counts 0 (its
    target row is 0 everywhere); the official evaluation differs only in normalising annotators'
    answers that all agree (see :mod:`vqa.data.answers`), which ``vqa/val.py`` reproduces exactly.

    Reads ``outputs['label_logits']`` float (N, A) and ``outputs['label']`` float (N, A).
    """

    def __init__(self, name="SoftAcc", allreduce=True):
        super().__init__(name, allreduce)

    def update(self, outputs):
        with torch.no_grad():
            logits, label = outputs["label_logits"], outputs["label"]
            top = logits.argmax(1, keepdim=True)
            self.sum_metric = self.sum_metric + label.gather(1, top).sum(dtype=torch.float64)
            self.num_inst = self.num_inst + logits.shape[0]
