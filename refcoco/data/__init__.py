"""RefCOCO+ data: importing this package registers the 'refcoco+' dataset with ``common.data.build``."""
from common.data.build import register_dataset

from .refcoco import RefCOCO

register_dataset("refcoco+", RefCOCO)

__all__ = ["RefCOCO"]
