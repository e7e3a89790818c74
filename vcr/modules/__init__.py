"""VCR models; ``build_model(config)`` builds the class named by ``config.MODULE``."""
from common.registry import Registry

from .resnet_vlbert_for_vcr import ResNetVLBERT

MODELS = Registry('vcr.modules', [ResNetVLBERT])
build_model = MODELS.build
