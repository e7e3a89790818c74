"""The cls model registry: ``MODULE`` -> class."""
from common.registry import Registry
from cls.modules.timm_classifier import TimmClassifier

MODELS = Registry("model of cls", [TimmClassifier])
