"""RefCOCO+ IoU (inclusive pixel corners, as the reference), training labels and the accuracy definition."""
import pytest
import torch
from torchvision.ops import box_iou as plain_box_iou

from refcoco.metrics import (RefAccuracy, box_iou, grounding_accuracy, grounding_correct, paired_box_iou,
                             positive_labels)


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


# (box a, box b, IoU by hand with widths x2 - x1 + 1)
HAND = [
    ([0, 0, 9, 9], [0, 0, 9, 9], 1.0),              # same box
    ([0, 0, 9, 9], [0, 0, 4, 9], 50 / 100),          # half of it: inside 5x10 of 10x10
    ([0, 0, 2, 1], [1, 0, 3, 1], 4 / (6 + 6 - 4)),   # 3x2 boxes sharing 2x2: exactly 0.5
    ([0, 0, 3, 3], [1, 0, 4, 3], 12 / (16 + 16 - 12)),  # 4x4 boxes sharing 3x4: 0.6
    ([0, 0, 1, 1], [1, 1, 2, 2], 1 / (4 + 4 - 1)),   # one shared corner pixel
    ([0, 0, 1, 1], [3, 3, 5, 5], 0.0),               # disjoint
]


@pytest.mark.parametrize("a, b, expected", HAND)
def test_iou_counts_corner_pixels_inclusive(a, b, expected):
    assert box_iou(t([a]), t([b])).item() == pytest.approx(expected, abs=1e-6)
    assert box_iou(t([b]), t([a])).item() == pytest.approx(expected, abs=1e-6)


def test_inclusive_convention_differs_from_plain_areas_at_the_threshold():
    a, b = t([[0, 0, 2, 1]]), t([[1, 0, 3, 1]])
    assert box_iou(a, b).item() == pytest.approx(0.5)
    assert plain_box_iou(a, b).item() == pytest.approx(1 / 3)  # torchvision's own convention


def test_iou_matrix_and_pairs():
    boxes = t([h[0] for h in HAND])
    others = t([h[1] for h in HAND])
    matrix = box_iou(boxes, others)
    assert matrix.shape == (6, 6) and matrix.dtype == torch.float32
    expected = torch.tensor([h[2] for h in HAND])
    assert torch.allclose(matrix.diagonal(), expected, atol=1e-6)
    assert torch.allclose(paired_box_iou(boxes, others), expected, atol=1e-6)
    # extra columns (scores, classes) are ignored
    assert torch.allclose(paired_box_iou(torch.cat([boxes, torch.ones(6, 2)], 1), others), expected, atol=1e-6)
    with pytest.raises(ValueError, match="6 boxes against 5"):
        paired_box_iou(boxes, others[:5])


def test_positive_label_is_iou_strictly_above_half():
    referred = t([0, 0, 9, 9])
    candidates = t([[0, 0, 9, 9],      # 1.0
                    [0, 0, 4, 9],      # 0.5: not positive
                    [0, 0, 5, 9],      # 60/100
                    [20, 20, 30, 30],  # 0
                    [1, 1, 9, 9]])     # 81/100
    assert positive_labels(candidates, referred).tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert positive_labels(candidates, referred).dtype == torch.float32


def test_correct_when_chosen_box_has_iou_at_least_half():
    referred = t([h[0] for h in HAND])
    chosen = t([h[1] for h in HAND])
    # IoU 1, 0.5, 0.5, 0.6, 1/7, 0: the two exact halves count as correct
    assert grounding_correct(chosen, referred).tolist() == [True, True, True, True, False, False]
    assert grounding_accuracy(chosen, referred) == pytest.approx(4 / 6)
    with pytest.raises(ValueError, match="no expressions"):
        grounding_accuracy(chosen[:0], referred[:0])


def test_ref_accuracy_counts_every_expression_once_by_dataset_index():
    referred = t([[0, 0, 9, 9], [10, 10, 19, 19], [0, 0, 2, 1], [5, 5, 8, 8], [0, 0, 1, 1]])
    metric = RefAccuracy(referred, allreduce=False)
    assert metric.get()[0] == "RefAcc"
    # batch 1: items 3 (wrong box), 0 (right); batch 2: items 2 (IoU 0.5: right), 4 (disjoint), 1 (right)
    metric.update({"pred_boxes": t([[0, 0, 9, 9], [0, 0, 9, 9]]), "index": torch.tensor([3, 0])})
    metric.update({"pred_boxes": t([[1, 0, 3, 1], [3, 3, 5, 5], [10, 10, 19, 19]]),
                   "index": torch.tensor([2, 4, 1])})
    assert metric.get() == ("RefAcc", pytest.approx(3 / 5))
    metric.reset()
    assert metric.num_inst.item() == 0
