"""Region features of images with the project's image encoder, as ``tools/extract_features.py`` writes
them and as a predictor of a model trained on such features recomputes them for a new photo.

The features are the ``obj_reps_raw`` of the encoder ``NETWORK.IMAGE_ENCODER`` names
(:mod:`common.modeling.image_encoder`), run as the end-to-end model runs it: the config's test transform
(SCALES resize, pixel normalisation), then the backbone, RoI Align and the pool.
"""
import os

import torch

from common.data.transforms import build_transforms
from common.errors import UserInputError
from common.modeling.image_encoder import build_image_encoder

__all__ = ["EXTRACTOR_OPTS", "build_region_extractor", "extract_regions"]

# Overrides that turn a task config into the image encoder's end to end (no precomputed input, no
# semantic head); the weights come from the file given, not from NETWORK.IMAGE_PRETRAINED.
EXTRACTOR_OPTS = ("NETWORK.IMAGE_FEAT_PRECOMPUTED", "false", "NETWORK.IMAGE_SEMANTIC", "false")


def build_region_extractor(cfg, weights=None, device="cpu", setting="--weights"):
    """``(image encoder in eval mode on device, test transform)`` of ``cfg`` (built with :data:`EXTRACTOR_OPTS`).

    Args:
        cfg: a task config whose NETWORK keys describe the encoder.
        weights: the encoder's weights file; None: ``NETWORK.IMAGE_PRETRAINED``.
        setting: how errors name ``weights`` (the option or key the user gave it with).
    Raises:
        FileNotFoundError: ``weights`` does not exist.
        UserInputError: weights of another network or another ResNet depth (names the file).
    """
    model = build_image_encoder(cfg)
    if weights:
        if not os.path.isfile(weights):
            raise FileNotFoundError("{}: '{}' does not exist".format(setting, weights))
        model.pretrained_path = weights
    try:
        model.init_weight()
    except UserInputError:
        raise
    except (ValueError, RuntimeError) as e:  # a file of another network or another ResNet depth
        raise UserInputError("image encoder weights '{}': {}".format(model.pretrained_path, e)) from None
    return model.eval().to(device), build_transforms(cfg, "test")


@torch.no_grad()
def extract_regions(model, transform, images, boxes, device="cpu"):
    """Features of each image's boxes and of the whole image, for images of one size (one forward).

    Args:
        model, transform: from :func:`build_region_extractor`.
        images: ``PIL.Image`` list, all of the same size (so their tensors stack without padding,
            which would change the features at the borders).
        boxes: float32 ``[N_i, 4]`` tensor per image, pixels of that image.
    Returns:
        list of (float32 ``[N_i, C]``, float32 ``[C]``) numpy array pairs, C = the encoder's ``feat_dim``.
    """
    samples = []
    for image, b in zip(images, boxes):
        w, h = image.size
        all_boxes = torch.cat((torch.tensor([[0.0, 0.0, w - 1.0, h - 1.0]]), b))
        samples.append(transform({"image": image, "boxes": all_boxes, "im_info": torch.tensor([w, h, 1.0, 1.0, 0.0])}))
    most = max(len(s["boxes"]) for s in samples)
    padded = torch.zeros(len(samples), most, 4)
    mask = torch.zeros(len(samples), most, dtype=torch.bool)
    for i, s in enumerate(samples):
        padded[i, :len(s["boxes"])] = s["boxes"]
        mask[i, :len(s["boxes"])] = True
    feats = model(torch.stack([s["image"] for s in samples]).to(device), padded.to(device), mask.to(device),
                  torch.stack([s["im_info"] for s in samples]).to(device))["obj_reps_raw"].float().cpu().numpy()
    return [(f[1:len(s["boxes"])], f[0]) for f, s in zip(feats, samples)]
