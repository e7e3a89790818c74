"""Boxes for images that come without any: a regular grid (no detector needed), or a boxes file."""
import torch

from common.errors import UserInputError

from .loading import load_json

__all__ = ["grid_boxes", "read_box_list"]


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


def read_box_list(path):
    """The entries of a boxes file, each with a float32 ``[N, 4]`` tensor under ``boxes``.

    Raises:
        UserInputError: not a list of ``{image_id, image, boxes}``, or a box row with fewer than 4
            numbers (names the file and the entry).
    """
    entries = load_json(path)
    if not isinstance(entries, list):
        raise UserInputError("{}: expected a JSON list of {{\"image_id\", \"image\", \"boxes\"}}".format(path))
    out = []
    for i, e in enumerate(entries):
        if not (isinstance(e, dict) and {"image_id", "image", "boxes"} <= e.keys()):
            raise UserInputError("{}: entry {} needs 'image_id', 'image' and 'boxes'".format(path, i))
        rows = e["boxes"]
        if not (isinstance(rows, list) and all(isinstance(r, list) and len(r) >= 4 for r in rows)):
            raise UserInputError("{}: image_id {}: 'boxes' must be a list of [x1, y1, x2, y2] rows".format(
                path, e["image_id"]))
        try:
            boxes = torch.tensor([r[:4] for r in rows], dtype=torch.float32).reshape(-1, 4)
        except (TypeError, ValueError):
            raise UserInputError("{}: image_id {}: box coordinates must be numbers".format(
                path, e["image_id"])) from None
        out.append(dict(e, boxes=boxes))
    return out
