"""Base class of the task models: one ``forward`` that dispatches on ``self.training``."""
import torch.nn as nn


class Module(nn.Module):
    """Task model base (reference release's ``common.module.Module`` contract).

    ``forward(*batch)`` calls ``train_forward(*batch)`` in training mode, which returns
    ``(outputs, loss)`` with ``outputs`` a dict of tensors read by the metrics by name and ``loss`` a
    scalar tensor; in eval mode it calls ``inference_forward(*batch)``, which returns the outputs dict.
    The batch is the dataset's tuple in ``data_names`` order. Subclasses implement both forwards and
    ``init_weight`` (called once at construction).
    """

    def __init__(self, config):
        super().__init__()
        self.config = config

    def init_weight(self):
        raise NotImplementedError

    def forward(self, *inputs, **kwargs):
        if self.training:
            return self.train_forward(*inputs, **kwargs)
        return self.inference_forward(*inputs, **kwargs)

    def train_forward(self, *inputs, **kwargs):
        raise NotImplementedError

    def inference_forward(self, *inputs, **kwargs):
        raise NotImplementedError
