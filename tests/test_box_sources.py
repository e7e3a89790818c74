import pytest
import torch

from common.data.box_sources import grid_boxes
from common.errors import UserInputError


def test_grid_cells_tile_the_image_after_the_whole_image_box():
    boxes = grid_boxes(10, 7, rows=2, cols=3)
    assert boxes.dtype == torch.float32
    assert boxes.tolist() == [[0, 0, 9, 6],
                              [0, 0, 2, 3], [3, 0, 6, 3], [7, 0, 9, 3],
                              [0, 4, 2, 6], [3, 4, 6, 6], [7, 4, 9, 6]]
    cells = boxes[1:]
    area = ((cells[:, 2] - cells[:, 0] + 1) * (cells[:, 3] - cells[:, 1] + 1)).sum()
    assert area == 10 * 7


def test_grid_without_the_whole_image_box():
    assert grid_boxes(4, 4, 1, 1, whole_image=False).tolist() == [[0, 0, 3, 3]]


def test_a_grid_larger_than_the_image_is_refused_with_both_sizes():
    with pytest.raises(UserInputError, match=r"photo.jpg: a 2x9 .*grid does not fit an image of 8x5"):
        grid_boxes(8, 5, 2, 9, name="photo.jpg")
