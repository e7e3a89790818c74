"""Loading images and JSON from folders or zip archives, with errors that name the file."""
import io
import json

from PIL import Image, ImageOps, UnidentifiedImageError

from common.errors import UserInputError

from .zipreader import read_bytes


def load_image(path):
    """Decode an image file (or ``archive.zip@/inner`` member) as a 3-channel RGB ``PIL.Image``.

    EXIF orientation is applied first (phone photos are often stored rotated), then grey,
    palette, CMYK and RGBA images are converted to RGB.

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: the bytes are not a decodable image (message names the file).
    """
    data = read_bytes(path)
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise UserInputError("cannot decode image '{}': {}".format(path, e)) from None
    image = ImageOps.exif_transpose(image)
    return image.convert("RGB") if image.mode != "RGB" else image


def load_json(path):
    """Parse a JSON file (or ``archive.zip@/inner`` member).

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: invalid JSON (message names the file, line and column).
    """
    data = read_bytes(path)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserInputError("invalid JSON in '{}': {}".format(path, e)) from None
