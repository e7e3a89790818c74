"""Pretraining data: importing this package registers the 'conceptual_captions' and 'general_corpus'
data sets with ``common.data.build``."""
from common.data.build import register_dataset

from .caption_dataset import ConceptualCaptionsDataset
from .general_corpus import GeneralCorpus

register_dataset("conceptual_captions", ConceptualCaptionsDataset)
register_dataset("general_corpus", GeneralCorpus)

__all__ = ["ConceptualCaptionsDataset", "GeneralCorpus"]
