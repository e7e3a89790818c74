"""Conversion of the reference release's YAML quirks into typed values.

The reference loader (EasyDict + PyYAML, github jackroos/VL-BERT ``*/function/config.py``)
special-cases a few keys while merging. We keep those rules in one table, applied to a raw
YAML value before the checked merge of :mod:`common.config`, so the merge itself stays generic
(the idea of detectron2's ``config/compat.py``).

Each converter takes the raw value and returns the typed value, or raises ``ValueError`` with a
sentence saying what was expected; the caller adds the file and the dotted key.
"""
import numbers
import re


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def to_float(value):
    """A float from an int, a float or a numeric string.

    PyYAML 6 reads ``1e-4`` (no dot in the mantissa) as a string, and users write ``LR: 1`` for
    a float key; the reference accepted both.
    """
    if _is_number(value):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise ValueError("expected a number, got {!r}".format(value))


def to_int(value):
    """An int from an int, a float with no fractional part (``20.0``) or a string of one (``"20"``);
    anything else (``1.5``, ``"ten"``, a bool) raises ValueError saying what was given."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
        return int(value)
    raise ValueError("expected int, got {} {!r}".format(type(value).__name__, value))


def _float_tuple(value):
    """``TRAIN.LR_STEP``: ``"14,18"`` (reference form), ``14`` or ``[14, 18]`` -> ``(14.0, 18.0)``."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
    elif _is_number(value):
        parts = [value]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        raise ValueError("expected a comma string like \"14,18\" or a list of epochs, got {!r}".format(value))
    try:
        return tuple(to_float(p) for p in parts)
    except ValueError:
        raise ValueError("expected epochs as numbers, like \"14,18\", got {!r}".format(value)) from None


def _pairs(value):
    """``TRAIN.LOSS_LOGGERS``: ``["ans_loss,AnsLoss", ...]`` or ``[[ans_loss, AnsLoss], ...]`` -> tuples."""
    if not isinstance(value, (list, tuple)):
        raise ValueError("expected a list of \"output_name,DisplayName\" strings, got {!r}".format(value))
    pairs = []
    for entry in value:
        fields = entry.split(",") if isinstance(entry, str) else entry
        if not isinstance(fields, (list, tuple)) or len(fields) != 2:
            raise ValueError("expected \"output_name,DisplayName\", got {!r}".format(entry))
        pairs.append(tuple(str(f).strip() for f in fields))
    return pairs


def _int_tuple(value):
    """``SCALES``: a list ``[600, 1200]`` -> the tuple ``(short side, max long side)`` in pixels."""
    if not isinstance(value, (list, tuple)) or not all(_is_number(v) for v in value):
        raise ValueError("expected a list of pixel sizes like [600, 1200], got {!r}".format(value))
    return tuple(int(v) if float(v).is_integer() else v for v in value)


def _number_tuple(value):
    """``PIXEL_MEANS`` / ``PIXEL_STDS``: three numbers (BGR order, 0-255 scale) -> float tuple."""
    if not isinstance(value, (list, tuple)):
        raise ValueError("expected a list of numbers, got {!r}".format(value))
    return tuple(to_float(v) for v in value)


def _loss_scale(value):
    """``TRAIN.FP16_LOSS_SCALE``: a number (static scale) or the string ``'dynamic'`` (the range is
    checked with the other values, :mod:`common.config.values`)."""
    if isinstance(value, str) and value.strip().lower() == "dynamic":
        return "dynamic"
    try:
        return to_float(value)
    except ValueError:
        raise ValueError("expected a positive number or 'dynamic', got {!r}".format(value)) from None


def _batch_images(value):
    """``*.BATCH_IMAGES``: images per GPU, an int, or one int per data set (multi-task pretraining);
    the range is checked with the other values (:mod:`common.config.values`)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    raise ValueError("expected a positive int or a list of positive ints, got {!r}".format(value))


def _lr_mult(value):
    """``TRAIN.LR_MULT``: ``[[name_substring, mult], ...]`` -> list of ``(str, float)``."""
    if not isinstance(value, (list, tuple)):
        raise ValueError("expected a list of [name_substring, multiplier] pairs, got {!r}".format(value))
    out = []
    for entry in value:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2 or not isinstance(entry[0], str):
            raise ValueError("expected [name_substring, multiplier], got {!r}".format(entry))
        out.append((entry[0], to_float(entry[1])))
    return out


def _prefix_changes(value):
    """``NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES``: ``["old_prefix->new_prefix", ...]``."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and "->" in v for v in value):
        raise ValueError("expected a list of \"old_prefix->new_prefix\" strings, got {!r}".format(value))
    return list(value)


# dotted key (a DATASET list entry uses the same names as the DATASET mapping) -> converter
CONVERTERS = {
    "SCALES": _int_tuple,
    "TRAIN.LR_STEP": _float_tuple,
    "TRAIN.LOSS_LOGGERS": _pairs,
    "TRAIN.LR_MULT": _lr_mult,
    "TRAIN.FP16_LOSS_SCALE": _loss_scale,
    "TRAIN.BATCH_IMAGES": _batch_images,
    "VAL.BATCH_IMAGES": _batch_images,
    "TEST.BATCH_IMAGES": _batch_images,
    "NETWORK.PIXEL_MEANS": _number_tuple,
    "NETWORK.PIXEL_STDS": _number_tuple,
    "NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES": _prefix_changes,
}
