"""VCR data: importing this package registers the 'vcr' dataset with ``common.data.build``."""
from common.data.build import register_dataset

from .vcr import VCRDataset

register_dataset("vcr", VCRDataset)

__all__ = ["VCRDataset"]
