"""Pre-training models; ``MODELS.build(cfg)`` builds the class named by ``cfg.MODULE``."""
from common.registry import Registry

from .resnet_vlbert_for_attention_vis import ResNetVLBERTForAttentionVis
from .resnet_vlbert_for_pretraining import ResNetVLBERTForPretraining
from .resnet_vlbert_for_pretraining_multitask import ResNetVLBERTForPretrainingMultitask

MODELS = Registry('model of pretrain', [ResNetVLBERTForPretraining, ResNetVLBERTForPretrainingMultitask,
                                        ResNetVLBERTForAttentionVis])
