"""A predictor's inputs and outputs: an image as the data sets read it, the best scores as predictions."""
import os

import numpy as np
import torch
from PIL import Image

from common.data.loading import load_image, to_rgb
from common.errors import UserInputError


def load_input_image(image, name="image"):
    """An input image as an RGB ``PIL.Image``: a path (decoded as the data sets do, EXIF orientation applied,
    :func:`common.data.loading.load_image`), a ``PIL.Image`` of any mode (:func:`common.data.loading.to_rgb`) or
    a numpy ``[H, W, 3]`` uint8 array (RGB).

    Raises:
        UserInputError: a missing file, a file that is not an image, an array of another shape or dtype, or
            another type (names ``name``).
    """
    if isinstance(image, (str, os.PathLike)):
        try:
            return load_image(os.fspath(image))
        except FileNotFoundError:
            raise UserInputError("{}: no such image file '{}'".format(name, image)) from None
        except UserInputError as e:
            raise UserInputError("{}: not an image: {}".format(name, e)) from None
    if isinstance(image, Image.Image):
        return to_rgb(image, name)
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise UserInputError("{}: expected a numpy array [H, W, 3] of uint8 (RGB), got {} {}".format(
                name, image.dtype, list(image.shape)))
        return Image.fromarray(image)
    raise UserInputError("{}: expected an image path, a PIL.Image or a numpy array, got {}".format(
        name, type(image).__name__))


def top_predictions(scores, labels, k):
    """``[{"label", "index", "score"}]`` of the ``k`` best of ``scores`` (float ``[C]``), best first (ties in
    index order); ``labels[i]`` names index i."""
    k = min(k, scores.shape[0])
    values, indices = torch.sort(scores.float(), descending=True, stable=True)
    return [{"label": str(labels[i]), "index": int(i), "score": float(v)}
            for v, i in zip(values[:k].tolist(), indices[:k].tolist())]
