"""Image backbones (torchvision ResNets adapted to the reference release's Caffe-style options)."""
from .resnet import (RESNET_DEPTHS, FrozenBatchNorm2d, ResNetC4, build_resnet, convert_frozen_batchnorm,
                     freeze_stages, load_resnet_weights, resnet_channels)

__all__ = ["RESNET_DEPTHS", "FrozenBatchNorm2d", "ResNetC4", "build_resnet", "convert_frozen_batchnorm",
           "freeze_stages", "load_resnet_weights", "resnet_channels"]
