"""Pad values of the pretraining fields, for ``common.data.collate.BatchCollator(pad_values=...)``.

The common defaults suit VCR; pretraining batches need their own:

- ``text``: 0 (``[PAD]``); the model masks text with ``ids > 0``.
- ``mlm_labels``: -1 (``masking.IGNORE``), so padding is never predicted (0 would be a label).
- ``boxes``: -2, as the reference: the box mask is ``boxes[..., 0] > -1.5`` (with precomputed
  features the last column is a feature, not a class, so the VCR rule cannot apply).
- ``mvrc_ops``: 0 (nothing replaced); ``mvrc_labels``: 0 (an all-zero target is ignored).
"""
from .masking import IGNORE

PAD_VALUES = {"text": 0, "mlm_labels": IGNORE, "boxes": -2.0, "mvrc_ops": 0, "mvrc_labels": 0.0}
