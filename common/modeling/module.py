"""Base class of the task models (one ``forward`` that dispatches on ``self.training``) and the warning
for parts of a model that keep their random initialisation."""
import contextlib
import warnings

import torch
import torch.nn as nn


class RandomInitWarning(UserWarning):
    """A part of the model keeps its random initialisation: the config names no pretrained file for it.

    Args:
        message: what stays random and which config key would name weights for it.
        module: that part (``nn.Module``) or None, so that a later load that fills it drops the warning.
    """

    def __init__(self, message, module=None):
        super().__init__(message)
        self.module = module


# Set inside checkpoint_sets_weights().
_SKIP_PRETRAINED = []


@contextlib.contextmanager
def checkpoint_sets_weights():
    """Inside: a model build reads no pretrained language weights (the ``NETWORK.BERT_MODEL_NAME`` folder's,
    ``NETWORK.BERT_PRETRAINED``), which a checkpoint's state dict, loaded strictly right after, replaces: a
    hand-off folder (:mod:`common.checkpoint.handoff`) carries the BERT folder's vocabulary and config, not its weights.
    The folder's config is still checked against ``NETWORK.VLBERT``."""
    _SKIP_PRETRAINED.append(True)
    try:
        yield
    finally:
        _SKIP_PRETRAINED.pop()


def pretrained_weights_skipped():
    """Whether the build runs inside :func:`checkpoint_sets_weights`."""
    return bool(_SKIP_PRETRAINED)


@contextlib.contextmanager
def held_random_init_warnings():
    """Hold back the :class:`RandomInitWarning` s raised inside; every other warning is passed on.

    Yields the list that receives the held warnings when the block ends: give it to
    :func:`warn_random_init` once it is known which weights were loaded afterwards, or drop it
    when a checkpoint sets every weight.
    """
    held = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield held
    for w in caught:
        if issubclass(w.category, RandomInitWarning):
            held.append(w.message)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def warn_random_init(model, held, loaded=()):
    """Re-issue the held warnings whose part of ``model`` took none of the ``loaded`` state-dict keys."""
    loaded = set(loaded)
    prefixes = {id(m): name for name, m in model.named_modules()}
    for w in held:
        if w.module is not None and id(w.module) in prefixes:
            prefix = prefixes[id(w.module)] + "." if prefixes[id(w.module)] else ""
            if any(prefix + k in loaded for k in w.module.state_dict()):
                continue
        warnings.warn(w, stacklevel=2)


def exporting():
    """True while ``torch.export`` traces the model (``torch.onnx.export(dynamo=True)`` does): code that sizes a
    tensor by a value of the batch (its longest text, its number of real boxes) then takes the inputs' padded
    size instead, so that the exported graph has no shape that depends on the data. Padding is masked, so the
    outputs at real positions are the same."""
    return torch.compiler.is_exporting()


class Module(nn.Module):
    """Task model base (reference release's ``common.module.Module`` contract).

    ``forward(*batch)`` calls ``train_forward(*batch)`` in training mode, which returns
    ``(outputs, loss)`` with ``outputs`` a dict of tensors read by the metrics by name and ``loss`` a
    scalar tensor; in eval mode it calls ``inference_forward(*batch)``, which returns the outputs dict.
    The batch is the dataset's tuple in ``data_names`` order. Subclasses implement both forwards and
    ``init_weight`` (called once at construction).
    """

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg

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
