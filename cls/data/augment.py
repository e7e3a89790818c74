"""The image-classification augmentation of the single-GPU ViT recipe, one config key per part.

Training: RandomResizedCrop (``TRAIN.RRC_SCALE``; empty: a plain resize), horizontal flip
(``TRAIN.FLIP_PROB``), TrivialAugmentWide (``TRAIN.TRIVIAL_AUGMENT``), normalisation
(``NETWORK.PIXEL_MEANS`` / ``PIXEL_STDS``), then timm's RandomErasing with a probability going linearly
from ``TRAIN.RANDOM_ERASING_PROB[0]`` at the first epoch to ``[1]`` at the last one. Evaluation: resize and
normalise. The guide's ``transforms.AutoAugment(policy='ta_wide')`` does not exist in torchvision (its
AutoAugmentPolicy has only IMAGENET, CIFAR10 and SVHN); ``transforms.TrivialAugmentWide`` is the
augmentation it means.

torchvision and timm draw from torch's and Python's global RNGs; each sample's draws are made inside
those RNGs seeded from its ``SampleKey`` generator (then restored), so an image's augmentation depends on
the seed, the epoch and the index only (not on the worker, the rank count or a resume).
"""
import contextlib
import random

import torch
from timm.data.random_erasing import RandomErasing
from torchvision import transforms as T


@contextlib.contextmanager
def _seeded_global_rngs(generator):
    """Inside: torch's CPU RNG and Python's ``random`` seeded from ``generator`` (restored on exit);
    ``generator`` None: the global RNGs as they are."""
    if generator is None:
        yield
        return
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator))
    state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        try:
            yield
        finally:
            random.setstate(state)


def erasing_probability(start, end, epoch, epochs):
    """RandomErasing probability at 0-based ``epoch`` of ``epochs``: linear from ``start`` (first epoch) to
    ``end`` (last epoch); later epochs keep ``end``."""
    if epochs <= 1:
        return start
    return start + (end - start) * min(epoch, epochs - 1) / (epochs - 1)


class Augment:
    """``augment(image PIL RGB, generator or None, epoch int) -> float32 [3, S, S]`` (normalised).

    Args:
        geometric: PIL -> PIL transform (crop or resize, flip, TrivialAugmentWide).
        mean, std: RGB, 0-1 scale.
        erasing: (start, end) RandomErasing probability, or None; ``epochs`` the training length.
    """

    def __init__(self, geometric, mean, std, erasing=None, epochs=1):
        self.geometric = geometric
        self.mean, self.std = list(mean), list(std)
        self.to_tensor = T.Compose([T.ToTensor(), T.Normalize(mean, std)])
        self.erasing = erasing
        self.epochs = epochs
        self.eraser = RandomErasing(probability=0.0, mode="pixel", device="cpu") if erasing else None

    def __call__(self, image, generator=None, epoch=0):
        with _seeded_global_rngs(generator):
            x = self.to_tensor(self.geometric(image))
            if self.eraser is not None:
                self.eraser.probability = erasing_probability(*self.erasing, epoch, self.epochs)
                x = self.eraser(x)
        return x


def build_augment(cfg, mode):
    """The :class:`Augment` of ``mode`` ('train' augments, 'val' / 'test' resize) from the cls keys."""
    size = cfg.DATASET.IMAGE_SIZE
    mean = [m / 255.0 for m in reversed(cfg.NETWORK.PIXEL_MEANS)]  # the keys are BGR, 0-255
    std = [s / 255.0 for s in reversed(cfg.NETWORK.PIXEL_STDS)]
    if mode != "train":
        return Augment(T.Resize((size, size), antialias=True), mean, std)
    train = cfg.TRAIN
    parts = [T.RandomResizedCrop(size, scale=tuple(train.RRC_SCALE), antialias=True) if train.RRC_SCALE
             else T.Resize((size, size), antialias=True)]
    if train.FLIP_PROB > 0:
        parts.append(T.RandomHorizontalFlip(train.FLIP_PROB))
    if train.TRIVIAL_AUGMENT:
        parts.append(T.TrivialAugmentWide())
    erasing = tuple(train.RANDOM_ERASING_PROB) if any(train.RANDOM_ERASING_PROB) else None
    return Augment(T.Compose(parts), mean, std, erasing, epochs=train.END_EPOCH - train.BEGIN_EPOCH)
