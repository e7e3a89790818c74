"""Batch collation: pad per batch, then stack."""
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


def pad_stack(tensors, pad=0):
    """Stack tensors of the same rank, padding each dim at its end to the batch maximum.

    Args:
        tensors (list of Tensor): shapes ``(d0_i, d1_i, ...)``, same rank and dtype.
        pad: fill value.
    Returns:
        Tensor ``(N, max d0, max d1, ...)``.
    """
    if all(t.shape == tensors[0].shape for t in tensors):
        return torch.stack(tensors)
    shape = [max(s) for s in zip(*(t.shape for t in tensors))]
    out = tensors[0].new_full([len(tensors)] + shape, pad)
    for o, t in zip(out, tensors):
        o[tuple(slice(0, n) for n in t.shape)] = t
    return out


class BatchCollator:
    """Collate items given as tuples in ``data_names`` order.

    Tensor fields are padded (``pad_stack``) to the batch maximum in every dim: images to
    the largest ``(H, W)``, boxes/masks to the most boxes, text to the longest. Fields that
    are lists of tensors (answer / rationale choices and their align matrices) become one
    tensor ``(N, num_choices, ...)`` padded over all choices of the batch. Anything else is
    returned as a list.

    Args:
        data_names (list of str): field names of an item, in order.
        pad_values (dict): name -> pad value, overriding ``DEFAULT_PAD_VALUES``.
        append_ind (bool): append the int64 position of each item in the batch as a last
            field (``DATASET.APPEND_INDEX``).
    Raises:
        ValueError: items of one batch with different numbers of choices in a list field.
    """

    def __init__(self, data_names, pad_values=None, append_ind=False):
        self.data_names = list(data_names)
        self.pad_values = dict(DEFAULT_PAD_VALUES, **(pad_values or {}))
        self.append_ind = append_ind

    def _collate_field(self, name, values):
        pad = self.pad_values.get(name, 0)
        first = values[0]
        if isinstance(first, torch.Tensor):
            return pad_stack(list(values), pad)
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
        if self.append_ind:
            fields += (torch.arange(len(batch), dtype=torch.int64),)
        return fields
