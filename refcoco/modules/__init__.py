"""RefCOCO+ models; ``build_model(config)`` builds the class named by ``config.MODULE``."""
from common.registry import Registry

from .resnet_vlbert_for_refcoco import ResNetVLBERT

MODELS = Registry('refcoco.modules', [ResNetVLBERT])
build_model = MODELS.build
