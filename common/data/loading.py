"""Loading images and JSON from folders, zip archives or LMDB stores (``common.data.storage``), with errors that
name the file."""
import io
import json
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

from common.errors import UserInputError

from .storage import read_bytes


def load_image(path):
    """Decode an image file (or ``archive.zip@/inner`` member, ``store.lmdb@/inner`` key) as a 3-channel RGB ``PIL.Image``.

    EXIF orientation is applied first (phone photos are often stored rotated), then grey,
    palette, CMYK and RGBA images are converted to RGB.

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: the bytes are not a decodable image (message names the file).
    """
    return decode_image(read_bytes(path), path)


def decode_image(data, name):
    """Decode image bytes as :func:`load_image` does; ``name`` (the file or archive member) goes into errors.

    Raises:
        UserInputError: the bytes are not a decodable image.
    """
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise UserInputError("cannot decode image '{}': {}".format(name, e)) from None
    image = ImageOps.exif_transpose(image)
    return image.convert("RGB") if image.mode != "RGB" else image


class ImageSizeWarning(UserWarning):
    """A decoded image is not the size its metadata gives, but its boxes fit it (see :func:`check_image_size`)."""


def check_image_size(image_path, size, recorded_size, recorded_in, boxes, error=UserInputError):
    """Compare a decoded image with the size its metadata gives, before its boxes are clipped to it.

    EXIF orientation is applied when decoding (:func:`load_image`), so a photo whose metadata was
    measured on the stored pixels comes out with width and height swapped; clipping boxes of the other
    orientation to it would cut them silently.

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
    sizes = "{} is {}x{} pixels as decoded (EXIF orientation applied) but {}x{} in {}".format(
        image_path, w, h, *recorded_size, recorded_in)
    outside = ((boxes[:, 2] > w) | (boxes[:, 3] > h)).nonzero()
    if len(outside):
        box = [round(float(v), 2) for v in boxes[int(outside[0]), :4]]
        raise error("{}, and the box {} reaches beyond the decoded image: the boxes are for another "
                    "orientation or size of the image; fix the metadata or the image".format(sizes, box))
    warnings.warn(ImageSizeWarning("{}; its boxes fit the decoded image and are used as they are".format(sizes)),
                  stacklevel=2)


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
