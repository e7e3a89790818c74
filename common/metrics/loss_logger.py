"""Loss logger: a metric that averages one loss of the model's outputs dict (TRAIN.LOSS_LOGGERS)."""
import torch

from .eval_metric import EvalMetric


class LossLogger(EvalMetric):
    """Mean over batches of ``outputs[output_name].mean()``; batches without it, or where it is NaN (a
    model reports a loss over no labelled item as NaN, e.g. the filler batches of a ``DATASET`` list's
    evaluation), are skipped (the reference counted them, diluting the mean). No host sync.

    Args:
        output_name: key in the outputs dict (``'ans_loss'``).
        display_name: name in logs (``'AnsLoss'``); defaults to ``output_name``.
    """

    def __init__(self, output_name, display_name=None, allreduce=True):
        self.output_name = output_name
        super().__init__(display_name or output_name, allreduce)

    def update(self, outputs):
        if self.output_name in outputs:
            with torch.no_grad():
                value = outputs[self.output_name].detach().float().mean()
                counted = ~torch.isnan(value)
                self.sum_metric = self.sum_metric + torch.where(counted, value, value.new_zeros(()))
                self.num_inst = self.num_inst + counted.long()


def loss_loggers(pairs, skip=()):
    """One :class:`LossLogger` per ``(output_name, display_name)`` of ``pairs`` (``TRAIN.LOSS_LOGGERS``),
    leaving out the output names in ``skip`` (losses the configured model does not compute)."""
    return [LossLogger(output_name, display_name) for output_name, display_name in pairs if output_name not in skip]
