"""The cls task's ONNX graph: normalised images in, class logits out."""
import torch
import torchvision.transforms as T

from cls.data.augment import build_augment
from common.inference.onnx_export import NamedOutputs, OnnxGraph

# Batch size of each example case: case 0 is traced, 1..3 are checked.
BATCHES = (2, 1, 3, 4)


def cls_onnx_graph(cfg, model):
    """:class:`common.inference.onnx_export.OnnxGraph` of a :class:`cls.modules.TimmClassifier`.

    Input ``image`` float32 ``[batch, 3, S, S]``, S = ``DATASET.IMAGE_SIZE``, pixels already normalised by
    ``NETWORK.PIXEL_MEANS`` / ``PIXEL_STDS`` (the test transform's output); output ``label_logits`` float32
    ``[batch, NETWORK.NUM_CLASSES]``. Only the batch axis is dynamic (timm fixes the image size of a ViT).
    Metadata: :func:`preprocessing` (the class names are the exporter's, from the run's ``predictor.json``).
    """
    size = cfg.DATASET.IMAGE_SIZE

    def example(case):
        g = torch.Generator().manual_seed(case)
        return (torch.randn(BATCHES[case], 3, size, size, generator=g),)

    return OnnxGraph(NamedOutputs(model, ["label_logits"], fixed={1: None}), ["image"], ["label_logits"],
                     {"image": {0: "batch"}}, example, preprocessing(cfg))


def preprocessing(cfg):
    """The test transform (:func:`cls.data.augment.build_augment`) in timm's ``pretrained_cfg`` names:
    ``input_size`` [3, S, S], ``interpolation`` (Pillow's resampling filter, lower case), ``mean`` and ``std``
    (RGB, 0-1 scale: the config's BGR 0-255 ``NETWORK.PIXEL_MEANS`` / ``PIXEL_STDS`` reversed and divided),
    ``crop_pct`` 1.0 and ``crop_mode`` 'squash' (the whole image resized to S x S, aspect not kept)."""
    augment = build_augment(cfg, "test")
    resize = augment.geometric
    assert isinstance(resize, T.Resize) and list(resize.size) == [cfg.DATASET.IMAGE_SIZE] * 2, resize
    size = cfg.DATASET.IMAGE_SIZE
    return {"input_size": [3, size, size], "interpolation": resize.interpolation.value, "mean": augment.mean,
            "std": augment.std, "crop_pct": 1.0, "crop_mode": "squash"}
