"""VQA data: importing this package registers the 'vqa' dataset with ``common.data.build``."""
from common.data.build import register_dataset

from .vqa import VQADataset

register_dataset("vqa", VQADataset)

__all__ = ["VQADataset"]
