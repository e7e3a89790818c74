"""What the VL-BERT task models (VCR, VQA, pretraining) share: pretrained language weights, special token
ids, object-linguistic embeddings, answer classifiers, input packing and frozen-BN handling."""

import torch
import torch.nn as nn

from common.modeling.module import Module, exporting
from common.modeling.nlp.bert_loading import language_pretrained_weights, special_token_ids
from common.modeling.nlp.modeling import BertPredictionHeadTransform
from common.runtime.logs import get_logger

logger = get_logger(__name__)

# Object classes of the reference's COCO-style detections: 80 classes + background.
NUM_OBJECT_CLASSES = 81


class VLBertModule(Module):
    """Base of the task models.

    Sets ``self.special_ids`` ({'[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'} -> id, from
    ``NETWORK.BERT_MODEL_NAME``/vocab.txt or BERT's standard ids when the name is empty). Frozen BatchNorm
    (``NETWORK.IMAGE_FROZEN_BN``) needs no ``train()`` override: ``FastRCNN`` uses layers that never update.
    """

    def __init__(self, cfg):
        super().__init__(cfg)
        self.special_ids = special_token_ids(cfg.NETWORK.BERT_MODEL_NAME)

    def language_weights(self):
        """Pretrained BERT weights chosen by the config (canonical keys), or None (random init, warned)."""
        weights, self.language_weights_path = language_pretrained_weights(self.cfg.NETWORK)
        return weights

    def apply_bert_frozen(self, bert):
        """``NETWORK.BERT_FROZEN``: stop training the BERT weights of ``bert`` (a ``VisualLinguisticBert``;
        see its ``language_parameters``). They get no gradient, so no optimizer (weight decay included) moves them."""
        if not self.cfg.NETWORK.BERT_FROZEN:
            return
        params = bert.language_parameters()
        for p in params:
            p.requires_grad_(False)
        logger.info("NETWORK.BERT_FROZEN: %d BERT weights frozen (%d tensors)", sum(p.numel() for p in params),
                    len(params))

    def report_unused(self, unused):
        """Log the pretrained-language keys that no parameter took."""
        if unused:
            logger.info("%s: %d key(s) not used by the model, e.g. %s", self.language_weights_path, len(unused),
                        unused[:5])


def object_linguistic_embedding(vlbert_config):
    """Token embedding of RoIs by ``object_word_embed_mode``.

    1: one row per object class (81); 2: one shared row; 3: none (the task averages the text's word
    embeddings). Returns an ``nn.Embedding`` or None; ValueError for another mode.
    """
    mode = vlbert_config.object_word_embed_mode
    if mode == 1:
        return nn.Embedding(NUM_OBJECT_CLASSES, vlbert_config.hidden_size)
    if mode == 2:
        return nn.Embedding(1, vlbert_config.hidden_size)
    if mode == 3:
        return None
    raise ValueError("NETWORK.VLBERT.object_word_embed_mode must be 1, 2 or 3, got {}".format(mode))


def answer_classifier(network_config, num_outputs):
    """Classifier on a VL-BERT feature [..., H] -> [..., num_outputs] (``NETWORK.CLASSIFIER_TYPE``).

    '1fc': Dropout, Linear. '2fc': Dropout, Linear(H, CLASSIFIER_HIDDEN_SIZE), ReLU, Dropout, Linear.
    'mlm': BERT's MLM transform (initialised from the pretrained ``cls.predictions.transform``),
    Dropout, Linear. Linear layers get Xavier-uniform weights and zero biases.
    """
    hidden = network_config.VLBERT.hidden_size
    dropout = network_config.CLASSIFIER_DROPOUT
    kind = network_config.CLASSIFIER_TYPE
    if kind == '1fc':
        layers = [nn.Dropout(dropout), nn.Linear(hidden, num_outputs)]
    elif kind == '2fc':
        layers = [nn.Dropout(dropout), nn.Linear(hidden, network_config.CLASSIFIER_HIDDEN_SIZE), nn.ReLU(inplace=True),
                  nn.Dropout(dropout), nn.Linear(network_config.CLASSIFIER_HIDDEN_SIZE, num_outputs)]
    elif kind == 'mlm':
        layers = [BertPredictionHeadTransform(network_config.VLBERT), nn.Dropout(dropout),
                  nn.Linear(hidden, num_outputs)]
    else:
        raise ValueError("NETWORK.CLASSIFIER_TYPE must be '1fc', '2fc' or 'mlm', got '{}'".format(kind))
    classifier = nn.Sequential(*layers)
    for m in classifier.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
    return classifier


def collect_obj_reps(span_tags, object_reps):
    """Feature of the object each token is grounded to.

    Args:
        span_tags: [B, ..., L] long object index per token (negative = none, read as object 0).
        object_reps: [B, N, D] object features.
    Returns:
        [B, ..., L, D].
    """
    batch, dim = object_reps.shape[0], object_reps.shape[-1]
    index = span_tags.clamp(min=0).reshape(batch, -1, 1).expand(-1, -1, dim)
    return object_reps.gather(1, index).reshape(*span_tags.shape, dim)


def valid_text_mask(ids, pad=0):
    """Valid tokens of right-padded word ids: True up to and with the last id of each row that is not ``pad``.

    An id 0 inside the text (a caption holding the literal word ``[PAD]``) stays a token: masking with
    ``ids > 0``, as the reference did, drops it and shifts every later output row by one, so MLM labels
    were scored against the next token's output.

    Args:
        ids: [..., L] word ids (long, or the float id column of a VCR text field), padded with ``pad`` at the end.
        pad: the padding id (0; VCR and VQA text fields are padded with ``common.data.collate.TEXT_PAD``).
    Returns:
        [..., L] bool.
    """
    return (ids != pad).flip(-1).cumsum(-1).flip(-1) > 0


def pack_text_pair(first_ids, first_tags, first_mask, second_ids, second_tags, second_mask, cls_id, sep_id,
                   one_sentence=False):
    """Pack two token sequences as BERT input: ``[CLS] a [SEP] b [SEP]`` (or ``[CLS] a b [SEP]``).

    Args:
        first_*, second_*: [..., La] / [..., Lb] word ids, grounding tags and bool masks (valid tokens
            first in each row); the leading dimensions of both must agree.
        one_sentence: one segment, no middle [SEP] (VCR ``QA_ONE_SENT``).
    Returns:
        input_ids, token_type_ids (0 for ``[CLS] a [SEP]``, 1 for ``b [SEP]``), tags, mask (bool), all
        [..., L] with L = max(len a + len b) + number of special tokens, and ``second_end`` [...] the
        index of the last token of ``b``.
    """
    first_len = first_mask.sum(-1, keepdim=True)
    second_len = second_mask.sum(-1, keepdim=True)
    num_special = 2 if one_sentence else 3
    longest = first_ids.shape[-1] + second_ids.shape[-1] if exporting() else int((first_len + second_len).max())
    length = longest + num_special
    k = torch.arange(length, device=first_ids.device)
    first_end = 1 + first_len
    second_start = first_end if one_sentence else first_end + 1
    second_end = second_start + second_len
    shape = first_ids.shape[:-1] + (length,)

    input_ids = first_ids.new_zeros(shape)
    tags = first_tags.new_zeros(shape)
    in_first = (k >= 1) & (k < first_end)
    in_second = (k >= second_start) & (k < second_end)
    input_ids[..., 0] = cls_id
    if not one_sentence:
        input_ids[k == first_end] = sep_id
    input_ids[k == second_end] = sep_id
    input_ids[in_first] = first_ids[first_mask]
    input_ids[in_second] = second_ids[second_mask]
    tags[in_first] = first_tags[first_mask]
    tags[in_second] = second_tags[second_mask]
    if one_sentence:
        token_type_ids = torch.zeros_like(input_ids)
    else:
        token_type_ids = ((k > first_end) & (k <= second_end)).to(input_ids.dtype)
    return input_ids, token_type_ids, tags, k <= second_end, (second_end - 1).squeeze(-1)
