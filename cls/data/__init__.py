"""Image-classification data sets, registered under their ``DATASET.DATASET`` names: 'cifar10', 'cifar100'
(the official "python version" pickles) and 'imagefolder' (``<split>/<class>/<image>``)."""
from common.data.build import register_dataset
from cls.data.datasets import CIFAR10, CIFAR100, ImageFolder

register_dataset("cifar10", CIFAR10)
register_dataset("cifar100", CIFAR100)
register_dataset("imagefolder", ImageFolder)
