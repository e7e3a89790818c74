"""VCR models; ``MODELS.build(cfg)`` builds the class named by ``cfg.MODULE``."""
from common.registry import Registry

from .resnet_vlbert_for_vcr import ResNetVLBERT

MODELS = Registry('model of vcr', [ResNetVLBERT])
