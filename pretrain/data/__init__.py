"""Pretraining data: importing this package registers the 'conceptual_captions', 'cc_shards',
'general_corpus' and 'coco_captions' data sets with ``common.data.build``."""
from common.data.build import register_dataset

from .caption_dataset import ConceptualCaptionsDataset
from .caption_shards import CaptionShardDataset
from .coco_captions import CaptionAttentionDataset
from .general_corpus import GeneralCorpus

register_dataset("conceptual_captions", ConceptualCaptionsDataset)
register_dataset("cc_shards", CaptionShardDataset)
register_dataset("general_corpus", GeneralCorpus)
register_dataset("coco_captions", CaptionAttentionDataset)

__all__ = ["CaptionAttentionDataset", "CaptionShardDataset", "ConceptualCaptionsDataset", "GeneralCorpus"]
