"""Pre-training models; ``build_model(config)`` builds the class named by ``config.MODULE``."""
from common.registry import Registry

from .resnet_vlbert_for_pretraining import ResNetVLBERTForPretraining
from .resnet_vlbert_for_pretraining_multitask import ResNetVLBERTForPretrainingMultitask

MODELS = Registry('pretrain.modules', [ResNetVLBERTForPretraining, ResNetVLBERTForPretrainingMultitask])
build_model = MODELS.build
