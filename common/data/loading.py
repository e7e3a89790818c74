"""Loading images and JSON from folders, zip archives or LMDB stores (``common.data.storage``), with errors that
name the file."""
import io
import json
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from common.errors import UserInputError

from .storage import read_bytes

ORIENTATION_TAG = 0x0112  # EXIF 'Orientation'
_TRANSPOSING = (5, 6, 7, 8)  # orientations that swap width and height (EXIF 2.3, tag 274)


class ImageSizeWarning(UserWarning):
    """A decoded image is not the size its metadata gives, but its boxes fit it (see :func:`check_image_size`)."""


class ImageOrientationWarning(UserWarning):
    """An image's metadata fits its stored pixels, not the orientation its EXIF tag asks for: the stored one is
    used (see :func:`decode_image`)."""


# Images already warned about by ImageOrientationWarning in this process (one warning per image).
_ORIENTATION_WARNED = set()
# What a transparent pixel becomes (RGBA, LA, P / L / RGB with a transparent colour): composited on white, as an
# image viewer shows it on a white page.
BACKGROUND = (255, 255, 255)
# 16-bit unsigned modes (16-bit PNG / TIFF greyscale): the format's full range 0..65535 maps to 0..255.
_UINT16_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
# Errors of Image.open / load on bytes that are not a readable image; DecompressionBombError is none of them.
_DECODE_ERRORS = (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError)


def _decode_message(name, error):
    """One line for a decoding ``error`` of the image ``name`` (never the in-memory buffer's repr)."""
    if isinstance(error, UnidentifiedImageError):
        return "cannot decode image '{}': not an image file Pillow can read (JPEG, PNG, ...)".format(name)
    if isinstance(error, Image.DecompressionBombError):
        return "cannot decode image '{}': {} (Pillow's guard, PIL.Image.MAX_IMAGE_PIXELS); resize it".format(
            name, str(error).split(", could be")[0])
    return "cannot decode image '{}': {}".format(name, error)


def to_rgb(image, name="image"):
    """An 8-bit RGB copy of a decoded ``PIL.Image`` of any mode (the image itself when it is RGB).

    - ``1``, ``L``, ``P``, ``CMYK``, ``YCbCr``, ``RGB``: Pillow's conversion (grey repeated on the 3 channels; CMYK
      by Pillow's plain formula, no colour profile).
    - with transparency (``RGBA``, ``LA``, ``PA``, ``P`` / ``L`` / ``RGB`` with a transparent colour):
      composited over :data:`BACKGROUND` (white).
    - ``I;16`` (16-bit greyscale PNG / TIFF): ``round(v / 257)``, the 16-bit range 0..65535 onto 0..255.
    - ``I`` (32-bit integers) and ``F`` (32-bit floats): no fixed range, so the image's own minimum..maximum
      onto 0..255 (``round(255 (v - min) / (max - min))``); a constant image keeps its value clipped to 0..255.
    - an animated image (GIF, APNG, WebP): the frame it is at (the first after opening).

    Raises:
        UserInputError: a mode Pillow cannot convert to RGB (names ``name`` and the mode).
    """
    if image.mode == "RGB":
        return image
    if image.mode in _UINT16_MODES + ("I", "F"):
        values = np.asarray(image, dtype=np.float64)
        if image.mode in _UINT16_MODES:
            scaled = values / 257.0
        else:
            low, high = float(values.min()), float(values.max())
            scaled = (values - low) * (255.0 / (high - low)) if high > low else np.clip(values, 0, 255)
        return Image.fromarray(np.round(scaled).astype(np.uint8)).convert("RGB")
    try:
        if image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info:
            rgba = image.convert("RGBA")
            return Image.alpha_composite(Image.new("RGBA", image.size, BACKGROUND + (255,)), rgba).convert("RGB")
        return image.convert("RGB")
    except ValueError as e:
        raise UserInputError("{}: image mode {} cannot be converted to RGB ({})".format(name, image.mode, e)) \
            from None


def load_image(path, recorded_size=None, recorded_in=""):
    """Decode an image file (or ``archive.zip@/inner`` member, ``store.lmdb@/inner`` key) as a 3-channel RGB ``PIL.Image``.

    EXIF orientation is applied first (phone photos are often stored rotated), unless the metadata's
    ``recorded_size`` is the stored pixels' size and not the rotated one (see :func:`decode_image`); then
    every other mode becomes 8-bit RGB (:func:`to_rgb`: transparency over white, 16-bit scaled to 8).

    Raises:
        FileNotFoundError: the file is missing.
        UserInputError: the bytes are not a decodable image, or an image over Pillow's decompression-bomb
            limit (message names the file).
    """
    return decode_image(read_bytes(path), path, recorded_size, recorded_in)


def decode_image(data, name, recorded_size=None, recorded_in=""):
    """Decode image bytes as :func:`load_image` does; ``name`` (the file or archive member) goes into errors.

    The detector that made an image's metadata saw one orientation of it: with ``recorded_size``
    (``(width, height)`` from the metadata in ``recorded_in``), an image whose EXIF orientation gives
    another size while its stored pixels have that one comes out as stored, with one
    :class:`ImageOrientationWarning` per image and process. When neither orientation is the recorded size,
    the EXIF one is returned (:func:`check_image_size` then decides).

    Raises:
        UserInputError: the bytes are not a decodable image, one over Pillow's decompression-bomb limit, or of
            a mode without an RGB conversion (names ``name``).
    """
    try:
        stored = Image.open(io.BytesIO(data))
        stored.load()
    except _DECODE_ERRORS as e:
        raise UserInputError(_decode_message(name, e)) from None
    image = ImageOps.exif_transpose(stored)
    if _keep_stored(name, stored, image.size, recorded_size, recorded_in):
        image = stored
    return to_rgb(image, name)


def image_size(path, recorded_size=None, recorded_in=""):
    """``(width, height)`` of the image :func:`load_image` would return with the same arguments (the same
    orientation rule and warning), from the file's header: the pixels are not decoded.

    Raises:
        FileNotFoundError: the file is missing.
        UserInputError: the file is not an image PIL can identify (names it).
    """
    data = read_bytes(path)
    try:
        stored = Image.open(io.BytesIO(data))
    except _DECODE_ERRORS as e:
        raise UserInputError(_decode_message(path, e)) from None
    w, h = stored.size
    upright = (h, w) if stored.getexif().get(ORIENTATION_TAG, 1) in _TRANSPOSING else (w, h)
    return stored.size if _keep_stored(path, stored, upright, recorded_size, recorded_in) else upright


def _keep_stored(name, stored, upright_size, recorded_size, recorded_in):
    """Whether the ``stored`` image (its EXIF orientation not applied) is the one to use: its size is the
    recorded one and the upright size is not (:class:`ImageOrientationWarning` the first time per ``name``)."""
    if recorded_size is None or upright_size == tuple(recorded_size) or stored.size != tuple(recorded_size):
        return False
    if name not in _ORIENTATION_WARNED:
        _ORIENTATION_WARNED.add(name)
        warnings.warn(ImageOrientationWarning(
            "{} has EXIF orientation {}: {}x{} pixels upright, {}x{} as stored, the size in {}; it is used as "
            "stored (the metadata was made on the stored pixels)".format(
                name, stored.getexif().get(ORIENTATION_TAG), *upright_size, *stored.size, recorded_in)),
            stacklevel=3)
    return True


def check_image_size(image_path, size, recorded_size, recorded_in, boxes, error=UserInputError):
    """Compare a decoded image with the size its metadata gives, before its boxes are clipped to it.

    :func:`load_image` given the metadata's size already picked the orientation (EXIF or as stored) that has
    it; a size that neither has (a resized image) is checked here: clipping boxes of another size of the
    image to it would cut them silently.

    Args:
        image_path (str): the image, for messages.
        size (tuple of int): ``(width, height)`` of the decoded image.
        recorded_size (tuple of number or None): ``(width, height)`` from the metadata; None checks nothing.
        recorded_in (str): where ``recorded_size`` comes from (a file), for messages.
        boxes (tensor): float ``(K, >= 4)`` ``x1, y1, x2, y2`` pixels of the metadata's image.
        error: exception class raised (a :class:`UserInputError` subclass).
    Warns:
        ImageSizeWarning: the sizes differ and every box lies within the decoded image (``x2 <= width``,
            ``y2 <= height``): the boxes are used as they are.
    Raises:
        error: the sizes differ and a box reaches beyond the decoded image (names the image,
            both sizes and the box).
    """
    if recorded_size is None or tuple(size) == tuple(recorded_size):
        return
    w, h = size
    sizes = "{} is {}x{} pixels as decoded (in either orientation) but {}x{} in {}".format(
        image_path, w, h, *recorded_size, recorded_in)
    outside = ((boxes[:, 2] > w) | (boxes[:, 3] > h)).nonzero()
    if len(outside):
        box = [round(float(v), 2) for v in boxes[int(outside[0]), :4]]
        raise error("{}, and the box {} reaches beyond the decoded image: the boxes are for another "
                    "orientation or size of the image; fix the metadata or the image".format(sizes, box))
    warnings.warn(ImageSizeWarning("{}; its boxes fit the decoded image and are used as they are".format(sizes)),
                  stacklevel=2)


def check_boxes_inside(image_path, size, boxes, recorded_in, error=UserInputError, ids=None):
    """Stop at a box that reaches beyond its image (training clips it silently; a data check reports it).

    Args:
        image_path (str): the image, for messages.
        size (tuple of int): ``(width, height)`` of the image.
        boxes (tensor): float ``(K, >= 4)`` ``x1, y1, x2, y2`` pixels (``x2 = width`` is inside).
        recorded_in (str): where the boxes come from, for messages.
        error: exception class raised (a :class:`UserInputError` subclass).
        ids: the name of each box in messages (its object index in the metadata); default its row.
    Raises:
        error: a box with ``x1 < 0``, ``y1 < 0``, ``x2 > width`` or ``y2 > height`` (names the box).
    """
    w, h = size
    outside = ((boxes[:, 0] < 0) | (boxes[:, 1] < 0) | (boxes[:, 2] > w) | (boxes[:, 3] > h)).nonzero()
    if len(outside):
        k = int(outside[0])
        raise error("{}: box {} {} reaches beyond the image {} ({}x{} pixels)".format(
            recorded_in, k if ids is None else ids[k], [round(float(v), 2) for v in boxes[k, :4]], image_path, w, h))


def load_json(path):
    """Parse a JSON file (or ``archive.zip@/inner`` member, ``store.lmdb@/inner`` key).

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: invalid JSON (message names the file, line and column).
    """
    return parse_json(read_bytes(path), path)


def parse_json(data, name):
    """Parse UTF-8 JSON bytes; ``name`` (the file or archive member) goes into errors.

    Raises:
        UserInputError: not UTF-8 or not valid JSON (names ``name``, the line and column).
    """
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserInputError("invalid JSON in '{}': {}".format(name, e)) from None


def read_json_lines(path, required=(), error=UserInputError, context=""):
    """The JSON objects of a JSON-lines file, one per non-blank line (blank lines skipped).

    Args:
        path: the file (must exist).
        required: field names every object must have.
        error: exception class raised for a bad line (a :class:`UserInputError` subclass).
        context: appended to the missing-field message, e.g. ``' (task Q2A)'``.
    Yields:
        ``(line_no, where, obj)``: 1-based line number, ``'<path> line <n>'`` for the caller's
        own messages, and the parsed dict.
    Raises:
        error: a line that is not valid JSON, not an object, or lacks a required field (the
            message names the file and line).
    """
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = "{} line {}".format(path, line_no)
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise error("{}: not valid JSON ({})".format(where, e)) from None
            if not isinstance(obj, dict):
                raise error("{}: expected a JSON object, got {}".format(where, type(obj).__name__))
            missing = [k for k in required if k not in obj]
            if missing:
                raise error("{}: missing field(s) {}{}".format(where, ", ".join(missing), context))
            yield line_no, where, obj
