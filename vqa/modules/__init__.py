"""VQA models; ``build_model(config)`` builds the class named by ``config.MODULE``."""
from common.registry import Registry

from .resnet_vlbert_for_vqa import ResNetVLBERT

MODELS = Registry('vqa.modules', [ResNetVLBERT])
build_model = MODELS.build
