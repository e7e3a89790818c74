"""Image + box transforms shared by all tasks.

A transform takes and returns a *sample* dict:

- ``image``: ``PIL.Image`` (RGB) before ``ToTensor``; float tensor ``(3, H, W)`` after.
- ``boxes``: float tensor ``(K, D)``, ``D >= 4``, columns ``x1, y1, x2, y2`` in pixels of
  the current image (inclusive pixel indices, as in the reference); other columns untouched.
- ``masks`` (optional): float tensor ``(K, M, M)``, instance masks in box coordinates.
- ``im_info``: float tensor ``(5,)``: ``width, height, scale_x, scale_y, index``.
- ``texts`` (optional): list of token lists; a token is a word string or a list of object
  indices (VCR format). Only the horizontal flip reads it.
- ``generator`` (optional): ``torch.Generator`` every random transform draws from. Datasets
  set it from the sample's ``SampleKey`` (``common.data.samplers``), which makes each random
  decision a function of ``(seed, epoch, index)`` alone; without it the draw comes from torch's
  global RNG (in a DataLoader worker: the worker's own, not reproducible across workers).

Difference from the reference release: its flip mirrors the image but leaves the text
alone, so "the man on the left" becomes false for half of the training samples. Ours also
swaps the words left <-> right (and leftmost <-> rightmost) so the label stays true. The
swap is word-based: "right" meaning "correct" is swapped too.
Padding is not a transform here: ``common.data.collate`` pads each image to the reference's fixed
``SCALES`` canvas (its VCR ``FixPadding``) when it stacks a batch.
"""
import re

import torch
from torchvision.transforms import functional as F


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, sample):
        for t in self.transforms:
            sample = t(sample)
        return sample

    def __repr__(self):
        body = "".join("\n    {}".format(t) for t in self.transforms)
        return "{}({}\n)".format(type(self).__name__, body)


def resized_size(width, height, min_size, max_size):
    """Output ``(width, height)`` when the short side becomes ``min_size`` unless the long side
    would exceed ``max_size``, in which case the long side becomes (about) ``max_size``.

    Same rounding as maskrcnn-benchmark / the reference (``int()`` truncation), so resized
    images have the reference's exact pixel sizes.
    """
    short, long = float(min(width, height)), float(max(width, height))
    size = min_size
    if max_size is not None and long / short * size > max_size:
        size = int(max_size * short / long)
    if min(width, height) == size:
        return width, height
    if width < height:
        return size, int(size * height / width)
    return int(size * width / height), size


class Resize:
    """Resize by ``SCALES = (min_size, max_size)``; boxes and ``im_info`` follow."""

    def __init__(self, min_size, max_size):
        if max_size is not None and min_size > max_size:
            raise ValueError("SCALES: short side {} is larger than max long side {}".format(min_size, max_size))
        self.min_size = min_size
        self.max_size = max_size

    def __call__(self, sample):
        image = sample["image"]
        w0, h0 = image.size
        w, h = resized_size(w0, h0, self.min_size, self.max_size)
        sample["image"] = F.resize(image, [h, w])
        sx, sy = w / w0, h / h0
        boxes = sample["boxes"]
        boxes[:, [0, 2]] *= sx
        boxes[:, [1, 3]] *= sy
        info = sample["im_info"]
        info[0], info[1], info[2], info[3] = w, h, sx, sy
        return sample

    def __repr__(self):
        return "Resize(min_size={}, max_size={})".format(self.min_size, self.max_size)


_LEFT_RIGHT = re.compile(r"\b(left|right)(most)?\b", re.IGNORECASE)


def _swap_word(match):
    word = match.group(1)
    swapped = {"left": "right", "right": "left"}[word.lower()]
    if word.isupper():
        swapped = swapped.upper()
    elif word[0].isupper():
        swapped = swapped.capitalize()
    return swapped + (match.group(2) or "")


def swap_left_right(tokens):
    """Copy of a token list (words, and object-index lists as in VCR) with left <-> right swapped
    in its word tokens.

    ``["the", "Left", "one", [0]]`` -> ``["the", "Right", "one", [0]]``; case is kept,
    object references (lists) are untouched.
    """
    return [_LEFT_RIGHT.sub(_swap_word, t) if isinstance(t, str) else t for t in tokens]


class RandomHorizontalFlip:
    """Mirror image, boxes and masks with probability ``prob``; swap left/right in ``texts``.

    A box ``x1, x2`` becomes ``w - 1 - x2, w - 1 - x1`` (inclusive pixel indices). The
    coin is one ``torch.rand`` draw from ``sample["generator"]`` (global RNG when absent); with
    ``prob`` 0 nothing is drawn. Sets ``sample["flipped"]``.
    """

    def __init__(self, prob=0.5):
        self.prob = prob

    def __call__(self, sample):
        flip = self.prob > 0 and torch.rand((), generator=sample.get("generator")).item() < self.prob
        sample["flipped"] = flip
        if not flip:
            return sample
        image = sample["image"]
        w = image.size[0]
        sample["image"] = F.hflip(image)
        boxes = sample["boxes"]
        boxes[:, [0, 2]] = (w - 1) - boxes[:, [2, 0]]
        if sample.get("masks") is not None:
            sample["masks"] = sample["masks"].flip(-1)
        if sample.get("texts") is not None:
            sample["texts"] = [swap_left_right(t) for t in sample["texts"]]
        return sample

    def __repr__(self):
        return "RandomHorizontalFlip(prob={})".format(self.prob)


class ToTensor:
    """PIL RGB image -> float tensor ``(3, H, W)`` in [0, 1]."""

    def __call__(self, sample):
        sample["image"] = F.to_tensor(sample["image"])
        return sample


class Normalize:
    """``(x - mean) / std`` per channel.

    With ``to_bgr255`` (what the reference always uses) the RGB [0, 1] tensor is first
    turned into BGR [0, 255], the input convention of the Caffe/Detectron-trained ResNet
    the reference starts from; ``PIXEL_MEANS`` (102.98, 115.95, 122.77) and
    ``PIXEL_STDS`` (1, 1, 1) are then in BGR order and 0-255 units.
    """

    def __init__(self, mean, std, to_bgr255=True):
        self.mean = list(mean)
        self.std = list(std)
        self.to_bgr255 = to_bgr255

    def __call__(self, sample):
        image = sample["image"]
        if self.to_bgr255:
            image = image[[2, 1, 0]] * 255
        sample["image"] = F.normalize(image, mean=self.mean, std=self.std)
        return sample

    def __repr__(self):
        return "Normalize(mean={}, std={}, to_bgr255={})".format(self.mean, self.std, self.to_bgr255)


def clip_boxes_(boxes, width, height):
    """Clamp ``boxes[:, :4]`` in place to the image: x in [0, width - 1], y in [0, height - 1]."""
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clamp(min=0, max=width - 1)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clamp(min=0, max=height - 1)
    return boxes


def build_transforms(cfg, mode="train"):
    """The reference's pipeline from config: Resize(SCALES) -> flip -> ToTensor -> Normalize.

    Args:
        cfg: CfgNode with ``SCALES`` (``()`` keeps the original size),
            ``NETWORK.PIXEL_MEANS / PIXEL_STDS`` and ``TRAIN / VAL / TEST.FLIP_PROB``.
        mode: ``'train'``, ``'val'`` or ``'test'`` (selects the FLIP_PROB).
    Raises:
        ValueError: unknown mode, or SCALES not empty and not a pair.
    """
    if mode not in ("train", "val", "test"):
        raise ValueError("mode must be 'train', 'val' or 'test', got {!r}".format(mode))
    if len(cfg.SCALES) not in (0, 2):
        raise ValueError("SCALES must be (short side, max long side) or empty, got {!r}".format(cfg.SCALES))
    resize = [Resize(cfg.SCALES[0], cfg.SCALES[1])] if cfg.SCALES else []
    return Compose(resize + [
        RandomHorizontalFlip(cfg[mode.upper()].FLIP_PROB),
        ToTensor(),
        Normalize(cfg.NETWORK.PIXEL_MEANS, cfg.NETWORK.PIXEL_STDS, to_bgr255=True),
    ])
