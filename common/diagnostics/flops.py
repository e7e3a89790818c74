"""Model FLOPs of a training step, counted the standard way (Kaplan et al. 2020; PaLM appendix B).

A transformer encoder trained on ``T`` tokens costs ``6 x N x T`` FLOPs in its dense layers (N = the
weights of the matrix products each token goes through; forward 2NT, backward 4NT) plus, per
sequence of ``L`` tokens, ``12 x layers x hidden x L^2`` in attention (the ``QK^T`` and ``PV``
products: forward 4 L^2 hidden, backward twice that). Only real tokens count: these are the model
FLOPs of MFU, so work spent on padding lowers the utilisation instead of raising it.
"""
from typing import Iterable

import torch


def dense_weight_count(encoder: torch.nn.Module) -> int:
    """Weights of the ``nn.Linear`` layers of ``encoder`` (biases and LayerNorm gains excluded: they
    are element-wise work, not matrix products). For BERT: ``layers x (4 H^2 + 2 H I)``."""
    return sum(m.weight.numel() for m in encoder.modules() if isinstance(m, torch.nn.Linear))


def encoder_train_flops(dense_weights: int, seq_lens: Iterable[int], num_layers: int, hidden_size: int) -> int:
    """FLOPs of forward + backward of a transformer encoder over sequences of ``seq_lens`` tokens.

    Args:
        dense_weights: N, see :func:`dense_weight_count`.
        seq_lens: real (unpadded) tokens of each sequence.
        num_layers, hidden_size: of the encoder.
    Returns:
        ``sum over sequences of 6 N L + 12 layers hidden L^2`` (int).
    Raises:
        ValueError: a negative length.
    """
    total = 0
    for length in seq_lens:
        length = int(length)
        if length < 0:
            raise ValueError("sequence lengths must be >= 0, got {}".format(length))
        total += 6 * dense_weights * length + 12 * num_layers * hidden_size * length * length
    return total
