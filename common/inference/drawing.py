"""Drawing regions on photos: a thumbnail with its boxes, numbered boxes, and a value per region painted over
the photo (the attention maps of ``pretrain/function/attention_maps.py`` and the web page of
``common/inference/web_demo.py``)."""
import numpy as np
from PIL import ImageDraw

__all__ = ["thumbnail", "painted_regions", "draw_boxes", "paint_regions"]

# Colours of drawn boxes: every region, and a chosen one (the box a referring expression picks).
BOX_COLOUR, CHOSEN_COLOUR = (255, 215, 0), (255, 40, 40)
# Opacity of the values painted over the photo (0: photo only, 1: colours only).
PAINT_ALPHA = 0.6


def thumbnail(image, boxes, side, enlarge=False):
    """``(image scaled to side pixels on its longest side, boxes in its pixels)``.

    Args:
        image (PIL.Image): the photo. boxes: ``[R, 4]`` ``x1, y1, x2, y2`` pixels of ``image``.
        side (int): longest side of the result, pixels. enlarge (bool): also scale smaller images up.
    Returns:
        (RGB ``PIL.Image``, float64 ``[R, 4]`` numpy array).
    """
    scale = side / max(image.size)
    if not enlarge:
        scale = min(1.0, scale)
    small = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))
    return small.convert("RGB"), np.asarray(boxes, dtype=np.float64).reshape(-1, 4) * scale


def painted_regions(shape, boxes, values):
    """``[h, w]`` map: each box's area painted with its value, 0 elsewhere, smaller boxes on top (so every box
    shows where boxes overlap).

    Args:
        shape: ``(h, w, ...)`` of the image. boxes: ``[R, 4]`` pixels. values: ``[R]``.
    """
    heat = np.zeros(shape[:2])
    areas = (boxes[:, 2] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 1] + 1)
    for k in np.argsort(-areas, kind="stable"):
        x1, y1, x2, y2 = (int(round(v)) for v in boxes[k])
        heat[y1:y2 + 1, x1:x2 + 1] = values[k]
    return heat


def draw_boxes(image, boxes, chosen=None):
    """A copy of ``image`` with each box outlined and numbered (its index), box ``chosen`` in red, on top.

    Args:
        image (PIL.Image): RGB. boxes: ``[R, 4]`` pixels of ``image``. chosen (int or None): box to highlight.
    """
    out = image.copy()
    draw = ImageDraw.Draw(out)
    order = [k for k in range(len(boxes)) if k != chosen] + ([chosen] if chosen is not None else [])
    for k in order:
        colour = CHOSEN_COLOUR if k == chosen else BOX_COLOUR
        x1, y1, x2, y2 = (float(v) for v in boxes[k])
        draw.rectangle((x1, y1, x2, y2), outline=colour, width=3 if k == chosen else 2)
        draw.text((x1 + 3, y1 + 2), str(k), fill=(0, 0, 0), stroke_width=2, stroke_fill=colour)
    return out


def paint_regions(image, boxes, values):
    """``image`` with the :func:`painted_regions` map of ``values`` blended in (inferno colour map,
    :data:`PAINT_ALPHA`), boxes outlined in white.

    Args:
        image (PIL.Image): RGB. boxes: ``[R, 4]`` pixels of ``image``. values: ``[R]``, 0 to 1 (the colour scale).
    Returns:
        RGB ``PIL.Image`` of the size of ``image``.
    """
    from matplotlib import colormaps
    from PIL import Image

    pixels = np.asarray(image, dtype=np.float64)
    colours = colormaps["inferno"](painted_regions(pixels.shape, boxes, values))[..., :3] * 255
    out = Image.fromarray(((1 - PAINT_ALPHA) * pixels + PAINT_ALPHA * colours).round().astype(np.uint8))
    draw = ImageDraw.Draw(out)
    for x1, y1, x2, y2 in boxes:
        draw.rectangle((float(x1), float(y1), float(x2), float(y2)), outline=(255, 255, 255), width=1)
    return out
