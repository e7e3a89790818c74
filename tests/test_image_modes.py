"""Every image mode Pillow opens becomes the 8-bit RGB picture docs/predict.md promises
(``common.data.loading.load_image`` / ``to_rgb``): each mode is made with Pillow from a known array, written
to a file of a format that keeps it, and the decoded RGB compared with the expected array (tolerance 1: Pillow's
integer compositing and YCbCr rounding)."""
import numpy as np
import pytest
from PIL import Image

from common.data.loading import BACKGROUND, load_image, to_rgb
from common.errors import UserInputError

H, W = 4, 6
GREY = np.linspace(0, 255, H * W).round().astype(np.uint8).reshape(H, W)
ALPHA = np.linspace(255, 0, H * W).round().astype(np.uint8).reshape(H, W)
RGB = np.stack([GREY, 255 - GREY, np.full((H, W), 77, np.uint8)], -1)


def _grey(values):
    return np.repeat(np.asarray(values, np.uint8)[..., None], 3, -1)


def _over_white(rgb, alpha):
    """``rgb`` composited over BACKGROUND with ``alpha`` (0-255), rounded."""
    a = alpha[..., None] / 255.0
    return (rgb * a + np.array(BACKGROUND) * (1 - a)).round()


def _own_range(values):
    values = values.astype(np.float64)
    return _grey(((values - values.min()) * 255 / (values.max() - values.min())).round())


def _cases():
    """(name, writer(path) -> file, expected RGB array)."""
    ramp16 = np.linspace(0, 65535, H * W).round().astype(np.uint16).reshape(H, W)
    ints = np.linspace(-1000, 100000, H * W).round().astype(np.int32).reshape(H, W)
    floats = np.linspace(-1.5, 3.0, H * W, dtype=np.float32).reshape(H, W)
    bits = (np.indices((H, W)).sum(0) % 2).astype(bool)
    palette = [0, 0, 0, 250, 20, 20, 20, 250, 20, 20, 20, 250]  # index 0 (black) is the transparent one
    indices = (np.indices((H, W)).sum(0) % 4).astype(np.uint8)
    paletted = np.array(palette, np.uint8).reshape(4, 3)[indices]
    paletted[indices == 0] = BACKGROUND
    cmy = np.stack([GREY, 255 - GREY, np.full((H, W), 40, np.uint8), np.zeros((H, W), np.uint8)], -1)  # K = 0

    def save(image, suffix, **kw):
        def write(path):
            image.save(str(path) + suffix, **kw)
            return str(path) + suffix
        return write

    def p_image():
        image = Image.fromarray(indices, "L").convert("P")
        image.putpalette(palette)
        return image

    def exif_rotated(path):
        exif = Image.Exif()
        exif[0x0112] = 6  # shown rotated 90 degrees clockwise
        Image.fromarray(RGB).save(str(path) + ".png", exif=exif)
        return str(path) + ".png"

    def animated(path):
        frames = [Image.fromarray(RGB * 0 + c) for c in (np.uint8(200), np.uint8(30))]
        frames[0].save(str(path) + ".gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
        return str(path) + ".gif"

    return [
        ("1", save(Image.fromarray(bits), ".png"), _grey(bits * 255)),
        ("L", save(Image.fromarray(GREY), ".png"), _grey(GREY)),
        ("LA", save(Image.fromarray(np.stack([GREY, ALPHA], -1), "LA"), ".png"),
         _over_white(_grey(GREY), ALPHA)),
        ("P with transparency", save(p_image(), ".png", transparency=0), paletted),
        ("I", save(Image.fromarray(ints), ".tif"), _own_range(ints)),
        ("I;16", save(Image.fromarray(ramp16), ".png"), _grey((ramp16 / 257).round())),
        ("I;16B", save(Image.fromarray(ramp16.astype(">u2")), ".tif"), _grey((ramp16 / 257).round())),
        ("F", save(Image.fromarray(floats), ".tif"), _own_range(floats)),
        ("CMYK", save(Image.fromarray(cmy, "CMYK"), ".tif"), 255 - cmy[..., :3]),
        ("RGBA", save(Image.fromarray(np.concatenate([RGB, ALPHA[..., None]], -1)), ".png"),
         _over_white(RGB, ALPHA)),
        ("EXIF-rotated", exif_rotated, np.rot90(RGB, -1)),
        ("animated (first frame)", animated, np.full((H, W, 3), 200)),
    ]


@pytest.mark.parametrize("name,write,expected", _cases(), ids=[c[0] for c in _cases()])
def test_each_mode_decodes_to_the_expected_rgb(tmp_path, name, write, expected):
    path = write(tmp_path / "image")
    stored = Image.open(path)
    if name in ("1", "L", "LA", "I", "I;16", "I;16B", "F", "CMYK", "RGBA"):
        assert stored.mode == name  # the file keeps the mode under test
    decoded = load_image(path)
    assert decoded.mode == "RGB"
    np.testing.assert_allclose(np.asarray(decoded, np.float64), expected, atol=1)


def test_in_memory_ycbcr_and_an_unconvertible_mode():
    # YCbCr (no lossless file format keeps it): a grey image (Cb = Cr = 128) stays grey.
    ycbcr = Image.merge("YCbCr", [Image.fromarray(GREY), Image.new("L", (W, H), 128), Image.new("L", (W, H), 128)])
    np.testing.assert_allclose(np.asarray(to_rgb(ycbcr), np.float64), _grey(GREY), atol=1)
    # A constant 32-bit image has no range to stretch: its values, clipped to 0..255.
    np.testing.assert_array_equal(np.asarray(to_rgb(Image.fromarray(np.full((H, W), 300, np.int32)))), 255)
    # Premultiplied LA (in memory only) has no conversion in Pillow: one line naming the image and the mode.
    with pytest.raises(UserInputError, match=r"^upload.tif: image mode La cannot be converted to RGB"):
        to_rgb(Image.new("La", (2, 2)), "upload.tif")
