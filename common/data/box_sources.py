"""Boxes for images that come without any: a regular grid (no detector needed)."""
import torch

from common.errors import UserInputError

__all__ = ["grid_boxes"]


def grid_boxes(width, height, rows, cols, whole_image=True, name="image"):
    """The cells of a ``rows x cols`` grid over a ``width x height`` image, plus the whole image.

    Cell edges are ``round(i * width / cols)`` (and likewise for rows), so cells tile the image with
    no gap or overlap; a cell spans pixels ``x1 .. x2`` inclusive (the reference's ``x2 = w - 1``
    convention for the whole-image box).

    Args:
        width, height: image size in pixels.
        rows, cols: grid shape, each >= 1.
        whole_image: put ``[0, 0, width - 1, height - 1]`` first.
        name: how errors name the image (its path).

    Returns:
        float32 ``[whole_image + rows * cols, 4]`` boxes ``(x1, y1, x2, y2)`` in pixels, row-major.

    Raises:
        UserInputError: a grid shape < 1, or more cells than pixels along a side (names both sizes).
    """
    if rows < 1 or cols < 1:
        raise UserInputError("grid {}x{}: rows and columns must be >= 1".format(rows, cols))
    if cols > width or rows > height:
        raise UserInputError("{}: a {}x{} (rows x columns) grid does not fit an image of {}x{} pixels "
                             "(width x height)".format(name, rows, cols, width, height))
    xs = [round(i * width / cols) for i in range(cols + 1)]
    ys = [round(j * height / rows) for j in range(rows + 1)]
    cells = [[xs[i], ys[j], xs[i + 1] - 1, ys[j + 1] - 1] for j in range(rows) for i in range(cols)]
    if whole_image:
        cells.insert(0, [0, 0, width - 1, height - 1])
    return torch.tensor(cells, dtype=torch.float32)
