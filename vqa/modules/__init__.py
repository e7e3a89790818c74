"""VQA models; ``MODELS.build(cfg)`` builds the class named by ``cfg.MODULE``."""
from common.registry import Registry

from .resnet_vlbert_for_vqa import ResNetVLBERT

MODELS = Registry('model of vqa', [ResNetVLBERT])
