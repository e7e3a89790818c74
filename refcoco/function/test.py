"""RefCOCO+ evaluation: the box each expression picks, accuracy per split and the result JSON, in fp32 like
epoch-end validation (the project's one evaluation rule, see ``common.engine.run_validation``)."""
import json
from collections import OrderedDict

import torch

from common.engine import build_loader, inference_device, load_for_inference, run_validation
from common.safe_write import atomic_write
from common.trainer import to_device
from refcoco.metrics import grounding_correct

# Fields of a batch the model's inference forward takes (``RefCOCO.data_names`` order; a label follows in val).
INFERENCE_INPUTS = 4


class PredictedBoxes:
    """Metric-like recorder (``reset`` / ``update``) of the model's ``pred_boxes`` ``[B, 4]`` and ``index``
    ``[B]`` outputs; after a pass, :meth:`in_dataset_order` gives one box per dataset item."""

    def __init__(self):
        self.reset()

    def reset(self):
        self._index, self._boxes = [], []

    def update(self, outputs):
        self._index.append(outputs["index"].detach().long().cpu())
        self._boxes.append(outputs["pred_boxes"].detach().float().cpu())

    def in_dataset_order(self, size):
        """``[size, 4]`` float32 predicted boxes, row i for dataset item i.

        Raises:
            ValueError: the pass did not visit every item exactly once.
        """
        index = torch.cat(self._index) if self._index else torch.zeros(0, dtype=torch.long)
        if sorted(index.tolist()) != list(range(size)):
            raise ValueError("the evaluation visited {} items, not each of the {} items once".format(len(index), size))
        boxes = torch.empty(size, 4)
        boxes[index] = torch.cat(self._boxes)
        return boxes


def split_accuracies(dataset, pred_boxes):
    """Accuracy of ``pred_boxes`` (``[N, 4]``, dataset order, original pixels) per split of the items' refs,
    then over all items (IoU >= 0.5 with the referred box, every expression counted once).

    Returns:
        OrderedDict name -> (accuracy float, correct count int, expressions int); the splits in first-seen
        order, then ``'+'.join(dataset.image_sets)`` when that differs from the only split.
    """
    correct = grounding_correct(pred_boxes, dataset.referred_boxes)
    splits = dataset.splits
    result = OrderedDict()
    for split in OrderedDict.fromkeys(splits):
        mask = torch.tensor([s == split for s in splits])
        result[split] = correct[mask]
    whole = "+".join(dataset.image_sets)
    if list(result) != [whole]:
        result[whole] = correct
    return OrderedDict((name, (c.double().mean().item(), int(c.sum()), c.numel())) for name, c in result.items())


def print_accuracies(accuracies):
    """One line per split: ``RefCOCO+ accuracy on <split>: 0.812500 (13 of 16 expressions)``."""
    for name, (acc, correct, total) in accuracies.items():
        print("RefCOCO+ accuracy on {}: {:f} ({} of {} expressions)".format(name, acc, correct, total))


def val_accuracies(task, cfg, ckpt_path):
    """Accuracies (:func:`split_accuracies`) of the checkpoint on ``DATASET.VAL_IMAGE_SET`` with ``VAL_BOXES``,
    through the epoch-end validation loop (``common.engine.run_validation``, fp32)."""
    model = load_for_inference(task, cfg, ckpt_path, inference_device())
    loader = build_loader(task, cfg, "val")
    recorder = PredictedBoxes()
    run_validation(model, loader, recorder, cfg.DATASET.LABEL_INDEX_IN_BATCH)
    return split_accuracies(loader.dataset, recorder.in_dataset_order(len(loader.dataset)))


@torch.no_grad()
def predict_boxes(model, loader, autocast):
    """The box each expression of ``loader``'s data set picks, ``[N, 4]`` float32 in dataset order
    (original image pixels); ``autocast()`` gives the forward's context."""
    device = next(model.parameters()).device
    recorder = PredictedBoxes()
    for batch in loader:
        with autocast():
            recorder.update(model(*to_device(list(batch)[:INFERENCE_INPUTS], device)))
    return recorder.in_dataset_order(len(loader.dataset))


def write_result_json(path, dataset, pred_boxes):
    """The reference's result file: a JSON list, one ``{"ref_id", "sent_id", "box"}`` per expression in dataset
    order, ``box`` = ``[x1, y1, x2, y2]`` in original image pixels (``sent_id`` is our addition)."""
    rows = [{"ref_id": item["ref_id"], "sent_id": item["sent_id"], "box": box}
            for item, box in zip(dataset.items, pred_boxes.tolist())]
    text = json.dumps(rows)
    atomic_write(path, lambda f: f.write(text), binary=False, size_hint=len(text))
