"""Pre-training heads of VL-BERT (Su et al., ICLR 2020, section 3.2), with the reference release's names.

- ``BertOnlyMLMHead``: masked language modelling; the decoder weight is the word embedding matrix (tied).
- ``MVRCHead``: masked RoI classification over the 1601 Visual Genome classes of the Faster R-CNN detector
  (``visual_region_classes``).
- ``RelationshipHead``: caption-image relationship (matched / not matched) from the pooled output.
"""
import torch
import torch.nn as nn

from common.modeling.nlp.modeling import BertPredictionHeadTransform, activation


class BertLMPredictionHead(nn.Module):
    """Transform + tied decoder + per-word bias; [..., H] -> [..., vocab] logits.

    Args:
        config: BERT-style config (``hidden_size``, ``hidden_act``).
        embedding_weight: [vocab, H] word embedding Parameter, shared with the decoder.
    """

    def __init__(self, config, embedding_weight):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        vocab_size, hidden_size = embedding_weight.shape
        self.decoder = nn.Linear(hidden_size, vocab_size, bias=False)
        self.decoder.weight = embedding_weight
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden_states):
        return self.decoder(self.transform(hidden_states)) + self.bias


class BertOnlyMLMHead(nn.Module):
    """Masked language modelling head (``predictions.*`` keys, as BERT's ``cls.predictions``)."""

    def __init__(self, config, embedding_weight):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, embedding_weight)

    def forward(self, sequence_output):
        return self.predictions(sequence_output)


class MVRCHeadTransform(nn.Module):
    """Linear + activation (no LayerNorm); [..., H] -> [..., H]. Also the first layer of the VCR CNN-loss head."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)

    def forward(self, hidden_states):
        return self.act(self.dense(hidden_states))


class MVRCHead(nn.Module):
    """Masked visual RoI classification; [..., H] -> [..., visual_region_classes] logits (1601 in the paper)."""

    def __init__(self, config):
        super().__init__()
        self.transform = MVRCHeadTransform(config)
        self.region_cls_pred = nn.Linear(config.hidden_size, config.visual_region_classes)

    def forward(self, hidden_states):
        return self.region_cls_pred(self.transform(hidden_states))


class RelationshipHead(nn.Module):
    """Caption-image relationship; pooled [B, H] -> [B, 2] logits (the name matches BERT's NSP head)."""

    def __init__(self, config):
        super().__init__()
        self.caption_image_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled_output):
        return self.caption_image_relationship(pooled_output)
