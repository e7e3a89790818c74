"""Batch collation: pad, then stack.

Images are padded to the reference's fixed canvas when one is given (the VCR release's
``FixPadding``: ``SCALES`` short x long, turned to the image's orientation), so an image's
features do not depend on the other images of its batch; the other fields (and images without a
canvas) are padded to the batch maximum.
"""
import torch

# Pad value of VCR text rows (id and box columns): never a word id, and the box column never names a box.
TEXT_PAD = -2
# Pad value per field name; padded boxes have class -1 (``boxes[..., -1] > -0.5`` is the reference's box
# mask). Fields not listed are padded with 0.
DEFAULT_PAD_VALUES = {
    "image": 0.0, "boxes": -1.0, "masks": -1.0,
    "question": TEXT_PAD, "answer_choices": TEXT_PAD, "rationale_choices": TEXT_PAD, "answer": TEXT_PAD,
    "rationale": TEXT_PAD,
}


def index_from_im_info(fields):
    """Dataset index of each item of a batch whose ``im_info`` rows are ``width, height, scale_x, scale_y,
    index`` (VCR, VQA, RefCOCO+): int64 ``(N,)``. The models take ``im_info`` as it is, so the index stays
    stored there (float32, exact below 2**24) and is read once, here.

    Args:
        fields: dict name -> collated field, with ``im_info`` float ``(N, 5)``.
    """
    return fields["im_info"][:, 4].round().long()


class Batch(tuple):
    """A collated batch: the fields in ``names`` order (a tuple, what ``model(*batch)`` takes), also given
    by name, plus ``extras`` the model does not take (e.g. ``index``, the int64 ``(N,)`` dataset index).

    Args:
        fields: the collated fields.
        names: one name per field.
        extras: dict name -> value.
    Raises:
        ValueError: ``fields`` and ``names`` differ in length.
    """

    def __new__(cls, fields, names, extras=None):
        fields = tuple(fields)
        if len(fields) != len(names):
            raise ValueError("a batch of {} fields got {} names {}".format(len(fields), len(names), list(names)))
        batch = super().__new__(cls, fields)
        batch.names, batch.extras = tuple(names), dict(extras or {})
        return batch

    def __reduce__(self):  # DataLoader workers send batches by pickle
        return Batch, (tuple(self), self.names, self.extras)

    def as_dict(self):
        """dict name -> value of the fields, then the extras."""
        return dict(zip(self.names, self), **self.extras)

    def field(self, name):
        """The field or extra ``name``; KeyError naming the batch's names otherwise."""
        if name in self.extras:
            return self.extras[name]
        if name not in self.names:
            raise KeyError("the batch has no field {!r}: it has {}".format(name, list(self.names) + list(self.extras)))
        return self[self.names.index(name)]

    def without(self, name):
        """The batch less the field ``name`` (e.g. the label the model does not take in evaluation)."""
        keep = [i for i, n in enumerate(self.names) if n != name]
        return Batch([self[i] for i in keep], [self.names[i] for i in keep], self.extras)

    def replace(self, **fields):
        """The batch with the named fields replaced (same positions)."""
        unknown = set(fields) - set(self.names)
        if unknown:
            raise KeyError("the batch has no field {}: it has {}".format(sorted(unknown), list(self.names)))
        return Batch([fields.get(n, v) for n, v in zip(self.names, self)], self.names, self.extras)

    def map(self, fn):
        """The batch with ``fn`` applied to every field and extra."""
        return Batch([fn(v) for v in self], self.names, {k: fn(v) for k, v in self.extras.items()})

    def pin_memory(self):
        """Pinned copy (the DataLoader calls this with ``pin_memory=True``; a plain tuple would lose the names)."""
        return self.map(lambda v: v.pin_memory() if isinstance(v, torch.Tensor) else v)


def pad_stack(tensors, pad=0, min_shape=None):
    """Stack tensors of the same rank, padding each dim at its end to the batch maximum.

    Args:
        tensors (list of Tensor): shapes ``(d0_i, d1_i, ...)``, same rank and dtype.
        pad: fill value.
        min_shape (sequence of int, optional): pad to at least this shape (same rank).
    Returns:
        Tensor ``(N, D0, D1, ...)`` with ``Dj = max(max_i dj_i, min_shape[j])``.
    """
    shapes = [t.shape for t in tensors] + ([tuple(min_shape)] if min_shape is not None else [])
    if all(s == tensors[0].shape for s in shapes):
        return torch.stack(tensors)
    shape = [max(s) for s in zip(*shapes)]
    out = tensors[0].new_full([len(tensors)] + shape, pad)
    for o, t in zip(out, tensors):
        o[tuple(slice(0, n) for n in t.shape)] = t
    return out


def image_canvas(height, width, scales):
    """``(H, W)`` of the reference's fixed canvas for an image of ``height x width`` pixels.

    The VCR release's ``FixPadding`` (``vcr/data/transforms``): ``(short, long)`` of ``SCALES``
    for a landscape or square image (``height <= width``), ``(long, short)`` for a portrait one.

    Args:
        height, width (int): the image's size after ``Resize(SCALES)``.
        scales (pair of int): ``SCALES`` = (short side, max long side).
    Returns:
        tuple ``(H, W)`` of int.
    Raises:
        ValueError: the image does not fit its canvas (it was not resized by these ``SCALES``).
    """
    short, long_side = int(scales[0]), int(scales[1])
    canvas = (short, long_side) if height <= width else (long_side, short)
    if height > canvas[0] or width > canvas[1]:
        raise ValueError("image of {}x{} (HxW) does not fit the SCALES canvas {}x{}: images must be resized by "
                         "SCALES {} first".format(height, width, canvas[0], canvas[1], tuple(scales)))
    return canvas


class BatchCollator:
    """Collate items given as tuples in ``data_names`` order.

    Tensor fields are padded (``pad_stack``) to the batch maximum in every dim: boxes/masks to
    the most boxes, text to the longest. Images ``(3, H, W)`` are padded to their
    :func:`image_canvas` when ``scales`` is given, else to the largest ``(H, W)`` of the batch.
    With a canvas, a batch of one orientation is ``short x long`` (or ``long x short``) whatever
    its images, so each image's features are those it has alone; a batch mixing portrait and
    landscape images is padded to ``long x long``, as in the reference, and there the bottom or
    right border of an image sees more padding than alone. Fields that
    are lists of tensors (answer / rationale choices and their align matrices) become one
    tensor ``(N, num_choices, ...)`` padded over all choices of the batch. Anything else is
    returned as a list.

    Args:
        data_names (list of str): field names of an item, in order.
        pad_values (dict): name -> pad value, overriding ``DEFAULT_PAD_VALUES``.
        append_ind (bool): append the int64 position of each item in the batch as a last
            field named ``batch_position`` (``DATASET.APPEND_INDEX``).
        scales (pair of int, optional): ``SCALES`` of the fixed image canvas (see
            :func:`canvas_scales`); None pads images to the batch maximum.
        extras (dict): name -> function of the fields by name, giving a :class:`Batch` extra
            (e.g. ``{"index": index_from_im_info}``).
    Returns (on call):
        :class:`Batch`.
    Raises:
        ValueError: items of one batch with different numbers of choices in a list field; an
            image larger than its canvas.
    """

    def __init__(self, data_names, pad_values=None, append_ind=False, scales=None, extras=None):
        self.data_names = list(data_names)
        self.extras = dict(extras or {})
        self.pad_values = dict(DEFAULT_PAD_VALUES, **(pad_values or {}))
        self.append_ind = append_ind
        self.scales = tuple(scales) if scales else None

    def _collate_field(self, name, values):
        pad = self.pad_values.get(name, 0)
        first = values[0]
        if isinstance(first, torch.Tensor):
            min_shape = None
            if name == "image" and self.scales:
                canvases = [image_canvas(v.shape[-2], v.shape[-1], self.scales) for v in values]
                min_shape = first.shape[:-2] + tuple(max(c) for c in zip(*canvases))
            return pad_stack(list(values), pad, min_shape)
        if isinstance(first, (list, tuple)) and first and isinstance(first[0], torch.Tensor):
            counts = {len(v) for v in values}
            if len(counts) != 1:
                raise ValueError("field '{}': items of one batch have different numbers of entries {}".format(
                    name, sorted(counts)))
            flat = pad_stack([t for v in values for t in v], pad)
            return flat.view(len(values), len(first), *flat.shape[1:])
        return list(values)

    def __call__(self, batch):
        fields = tuple(self._collate_field(name, values) for name, values in zip(self.data_names, zip(*batch)))
        names = self.data_names
        if self.append_ind:
            fields += (torch.arange(len(batch), dtype=torch.int64),)
            names = names + ["batch_position"]
        by_name = dict(zip(names, fields))
        return Batch(fields, names, {name: fn(by_name) for name, fn in self.extras.items()})


def canvas_scales(cfg):
    """``SCALES`` of the fixed image canvas of ``cfg`` for :class:`BatchCollator`, or None.

    None (pad images to the batch maximum) when ``DATASET.PAD_TO_BATCH_MAX`` is set or ``SCALES``
    is empty (images keep their own sizes, so no canvas holds them all).

    Args:
        cfg: CfgNode with ``SCALES`` and ``DATASET.PAD_TO_BATCH_MAX``.
    Returns:
        tuple ``(short, long)`` of int, or None.
    """
    if cfg.DATASET.PAD_TO_BATCH_MAX or not cfg.SCALES:
        return None
    return tuple(int(s) for s in cfg.SCALES)


def num_samples(batch) -> int:
    """Samples in a batch: the size of dim 0 of its first tensor with a dim (0 if there is none)."""
    for b in batch:
        if isinstance(b, torch.Tensor) and b.dim() > 0:
            return b.shape[0]
    return 0


def to_device(batch, device):
    """Move the tensors of a batch (tuple/list, nested lists allowed) to ``device``; a
    :class:`Batch` stays one, with its names and extras."""
    if isinstance(batch, Batch):
        return batch.map(lambda v: to_device(v, device))
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return [to_device(b, device) for b in batch]
    return batch
