"""The cls task's ONNX graph: normalised images in, class logits out."""
import torch

from common.onnx_export import NamedOutputs, OnnxGraph

# Batch size of each example case: case 0 is traced, 1..3 are checked.
BATCHES = (2, 1, 3, 4)


def cls_onnx_graph(cfg, model):
    """:class:`common.onnx_export.OnnxGraph` of a :class:`cls.modules.TimmClassifier`.

    Input ``image`` float32 ``[batch, 3, S, S]``, S = ``DATASET.IMAGE_SIZE``, pixels already normalised by
    ``NETWORK.PIXEL_MEANS`` / ``PIXEL_STDS`` (the test transform's output); output ``label_logits`` float32
    ``[batch, NETWORK.NUM_CLASSES]``. Only the batch axis is dynamic (timm fixes the image size of a ViT).
    """
    size = cfg.DATASET.IMAGE_SIZE

    def example(case):
        g = torch.Generator().manual_seed(case)
        return (torch.randn(BATCHES[case], 3, size, size, generator=g),)

    return OnnxGraph(NamedOutputs(model, ["label_logits"], fixed={1: None}), ["image"], ["label_logits"],
                     {"image": {0: "batch"}}, example)
