"""RefCOCO+ evaluators: the box each expression picks, accuracy per split and the result JSON, through the one
inference loop (:func:`common.inference.evaluation.inference_on_dataset`, fp32)."""
import json
from collections import OrderedDict

import torch

from common.engine import build_loader, inference_device, load_for_inference
from common.fileio.safe_write import atomic_write
from common.inference.evaluation import IndexedPredictions, inference_on_dataset
from common.runtime import distributed as cdist
from refcoco.metrics import grounding_correct


class PredictedBoxes(IndexedPredictions):
    """The box each expression picks, the model's ``pred_boxes`` ``[B, 4]`` (original image pixels):
    ``evaluate()`` gives ``[size, 4]`` float32, row i for dataset item i, gathered over ranks (RuntimeError
    when the ranks together did not visit every item)."""

    def __init__(self, size):
        self.size = size
        self.reset()

    def predict(self, inputs, outputs):
        return outputs["pred_boxes"].float()

    def evaluate(self):
        return self.predictions(self.size)


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
    """Accuracies (:func:`split_accuracies`) of the checkpoint on ``DATASET.VAL_IMAGE_SET`` with ``VAL_BOXES``."""
    model = load_for_inference(task, cfg, ckpt_path, inference_device())
    loader = build_loader(task, cfg, "val")
    boxes = inference_on_dataset(model, loader, PredictedBoxes(len(loader.dataset)), task.label_index_in_batch(cfg))
    return split_accuracies(loader.dataset, boxes)


class ResultJSON(PredictedBoxes):
    """The predicted boxes of a split written to ``path`` (:func:`write_result_json`, rank 0), then the accuracy per
    split printed (:func:`print_accuracies`; the test labels are public). ``evaluate()`` returns ``path``.

    Args:
        dataset: the :class:`refcoco.data.RefCOCO` split.
    """

    def __init__(self, dataset, path):
        super().__init__(len(dataset))
        self.dataset, self.path = dataset, path

    def evaluate(self):
        boxes = super().evaluate()
        if cdist.is_main_process():
            write_result_json(self.path, self.dataset, boxes)
            print("result json saved to {}".format(self.path))
            print_accuracies(split_accuracies(self.dataset, boxes))
        cdist.barrier()
        return self.path


def write_result_json(path, dataset, pred_boxes):
    """The reference's result file: a JSON list, one ``{"ref_id", "sent_id", "box"}`` per expression in dataset
    order, ``box`` = ``[x1, y1, x2, y2]`` in original image pixels (``sent_id`` is our addition)."""
    rows = [{"ref_id": item["ref_id"], "sent_id": item["sent_id"], "box": box}
            for item, box in zip(dataset.items, pred_boxes.tolist())]
    text = json.dumps(rows)
    atomic_write(path, lambda f: f.write(text), binary=False, size_hint=len(text))
