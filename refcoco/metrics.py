"""Referring-expression grounding: box IoU, per-box training labels and accuracy (RefCOCO+ protocol).

Boxes are ``(x1, y1, x2, y2)`` in pixels with *inclusive* corners, the convention of the reference
release (and of the Detectron family it comes from): a box is ``x2 - x1 + 1`` pixels wide. Its IoU
(``common/utils/bbox.py`` and ``refcoco/function/test.py`` of the reference) therefore adds one pixel to
every width and height; :func:`box_iou` gets exactly that from ``torchvision.ops.box_iou`` by moving the
far corners one pixel out. Near the 0.5 threshold the two conventions disagree (``[0, 0, 2, 1]`` and
``[1, 0, 3, 1]``: 0.5 here, 1/3 with plain areas), so labels and accuracy follow the reference.

- Training label of a candidate box: 1 when its IoU with the referred box is > 0.5, else 0
  (:data:`POSITIVE_IOU`; one logit per box, binary cross-entropy).
- Accuracy: an expression is grounded correctly when the box with the highest logit has IoU >= 0.5
  with the referred box, in the original image's pixels; the denominator is every expression of the split.
"""
import torch
from torchvision.ops import box_iou as _plain_box_iou

from common.metrics.eval_metric import EvalMetric

POSITIVE_IOU = 0.5
# Pairs per chunk in paired_box_iou: bounds the temporary [chunk, chunk] IoU matrix.
_PAIR_CHUNK = 1024


def box_iou(boxes1, boxes2):
    """IoU of every pair of boxes with inclusive pixel corners (the reference's ``+ 1`` areas).

    Args:
        boxes1: ``[N, 4+]`` float, columns ``x1, y1, x2, y2`` (pixels; more columns are ignored).
        boxes2: ``[M, 4+]`` float, same layout.
    Returns:
        ``[N, M]`` float32 IoU in [0, 1] (0 for disjoint boxes).
    """
    far = boxes1.new_tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float32)
    return _plain_box_iou(boxes1[:, :4].float() + far, boxes2[:, :4].float() + far)


def paired_box_iou(boxes1, boxes2):
    """IoU of ``boxes1[i]`` with ``boxes2[i]`` for each i (inclusive corners, as :func:`box_iou`).

    Args:
        boxes1, boxes2: ``[N, 4+]`` float.
    Returns:
        ``[N]`` float32.
    Raises:
        ValueError: different numbers of boxes.
    """
    if boxes1.shape[0] != boxes2.shape[0]:
        raise ValueError("paired_box_iou: {} boxes against {}".format(boxes1.shape[0], boxes2.shape[0]))
    chunks = [box_iou(boxes1[s:s + _PAIR_CHUNK], boxes2[s:s + _PAIR_CHUNK]).diagonal()
              for s in range(0, boxes1.shape[0], _PAIR_CHUNK)]
    return torch.cat(chunks) if chunks else boxes1.new_zeros(0, dtype=torch.float32)


def positive_labels(boxes, referred_box):
    """Training target of each candidate box: IoU with the referred box > 0.5.

    Args:
        boxes: ``[K, 4+]`` float candidate boxes (pixels of the image the model sees).
        referred_box: ``[4]`` float, the referred object's box in the same pixels.
    Returns:
        ``[K]`` float32 of 0.0 / 1.0.
    """
    return (box_iou(boxes, referred_box[None]).squeeze(1) > POSITIVE_IOU).float()


def grounding_correct(pred_boxes, referred_boxes):
    """Whether each predicted box grounds its expression: IoU >= 0.5 with the referred box.

    Args:
        pred_boxes: ``[B, 4]`` float, the chosen (argmax) box of each expression, original image pixels.
        referred_boxes: ``[B, 4]`` float, the referred objects' boxes in the same pixels.
    Returns:
        ``[B]`` bool.
    """
    return paired_box_iou(pred_boxes, referred_boxes) >= POSITIVE_IOU


def grounding_accuracy(pred_boxes, referred_boxes):
    """Fraction of expressions grounded correctly (:func:`grounding_correct`) over all of them.

    Args:
        pred_boxes, referred_boxes: ``[N, 4]`` float, one row per expression of the split.
    Returns:
        float in [0, 1].
    Raises:
        ValueError: no expression (an empty split has no accuracy).
    """
    if pred_boxes.shape[0] == 0:
        raise ValueError("grounding_accuracy: no expressions")
    return grounding_correct(pred_boxes, referred_boxes).double().mean().item()


class RefAccuracy(EvalMetric):
    """Validation / test accuracy ``RefAcc`` over every expression the loader visits.

    Reads the model's ``pred_boxes`` ``[B, 4]`` (original image pixels) and ``index`` ``[B]`` (dataset index
    of each item) and compares each prediction with the referred box of that item.
    With ``allreduce`` the counts are summed over ranks, so an evaluation sampler that gives each item
    to exactly one rank yields the accuracy over the whole split.

    Args:
        referred_boxes: ``[N, 4]`` float, the referred box of every dataset item in index order
            (``RefCOCO.referred_boxes``).
        allreduce: sum over ranks in ``get()``.
    """

    def __init__(self, referred_boxes, allreduce=True):
        self.referred_boxes = torch.as_tensor(referred_boxes, dtype=torch.float32)
        super().__init__("RefAcc", allreduce)

    def update(self, outputs):
        pred = outputs["pred_boxes"].detach().float().cpu()
        index = outputs["index"].detach().long().cpu()
        correct = grounding_correct(pred, self.referred_boxes[index])
        self.sum_metric = self.sum_metric + correct.sum().double()
        self.num_inst = self.num_inst + correct.numel()


class ChosenBoxPositive(EvalMetric):
    """Training accuracy (the reference's training ``RefAcc``): the fraction of expressions whose highest-logit
    box is a positive candidate (label 1: IoU > 0.5 in the pixels the model sees).

    Reads ``label_logits`` ``[B, N]`` and ``label`` ``[B, N]`` (1 positive, 0 negative, -1 padded slot).
    """

    def update(self, outputs):
        logits, label = outputs["label_logits"].detach(), outputs["label"].detach()
        chosen = label.gather(1, logits.argmax(1, keepdim=True)).squeeze(1)
        self.sum_metric = self.sum_metric + (chosen > 0.5).sum().double()
        self.num_inst = self.num_inst + chosen.numel()
