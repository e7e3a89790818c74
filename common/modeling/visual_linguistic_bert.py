"""Visual-linguistic BERT (VL-BERT, Su et al., ICLR 2020), checkpoint-compatible with the reference release.

Input layout (paper, figure 1): the valid text tokens of a sample, then its valid RoIs, then one ``[END]``
element, then padding. Every element's embedding is the sum of

- a token embedding: the word embedding for text, the object-linguistic embedding for RoIs (given by
  the caller, appended to the RoI feature), a learnt ``[END]`` vector;
- a visual feature embedding: the RoI feature of the grounded object for text (given by the caller),
  the RoI's own feature for RoIs; each goes through its own LayerNorm (``visual_ln``) or learnt scale;
- a segment embedding: the caller's type ids (0/1) for text, type 2 for RoIs and ``[END]``;
- a position embedding: 0, 1, ... over the text; all RoIs share the position after the text
  (``obj_pos_id_relative``) and ``[END]`` takes the next one.

Parameter names equal the reference's (``word_embeddings``, ``end_embedding``, ``embedding_LayerNorm``,
``visual_ln_text`` ..., ``encoder.layer.N.*``, ``pooler``, ``relationsip_head`` [sic], ``mlm_head``,
``mvrc_head``).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.modeling.module import exporting
from common.modeling.nlp.heads import BertOnlyMLMHead, MVRCHead, RelationshipHead
from common.modeling.nlp.modeling import BertEncoder, BertPooler, LayerNorm, attention_bias, init_bert_weights
from common.runtime.logs import get_logger

logger = get_logger(__name__)

# Word ids below this are special tokens ([PAD], [unusedN], [CLS], [SEP], [MASK] in BERT's vocabularies);
# with ``word_embedding_frozen`` they keep a trainable copy (reference release constant).
NUM_SPECIAL_WORDS = 1000


class TextTooLongError(ValueError):
    """Rows of a batch whose text has more tokens than the position embeddings can number
    (:attr:`VisualLinguisticBert.max_text_tokens`).

    Attributes:
        rows (list of int): the rows (of the batch the VL-BERT sees) over the limit.
        lengths (list of int): their text tokens.
        batch_rows (int): rows of that batch. limit (int): the most text tokens a row may have.
    """

    def __init__(self, rows, lengths, batch_rows, limit, max_positions):
        self.rows, self.lengths, self.batch_rows, self.limit = rows, lengths, batch_rows, limit
        super().__init__("text of {} tokens (batch row {}): NETWORK.VLBERT.max_position_embeddings {} numbers at "
                         "most {} text tokens (the regions and [END] take the next two positions)".format(
                             lengths[0], rows[0], max_positions, limit))


class VisualLinguisticBert(nn.Module):
    """VL-BERT backbone: embeddings, BERT encoder and optional pooler.

    Args:
        config: the ``NETWORK.VLBERT`` node (BERT keys plus ``visual_size``, ``visual_ln``,
            ``visual_scale_text_init``, ``visual_scale_object_init``, ``word_embedding_frozen``,
            ``obj_pos_id_relative``, ``with_pooler``, ``position_padding_idx``).
        language_state_dict: optional pretrained BERT weights in canonical form (see
            ``common.modeling.nlp.bert_loading.read_bert_weights``) copied into the embeddings, encoder and pooler.
        gradient_checkpointing: recompute encoder layers in backward (``NETWORK.GRADIENT_CHECKPOINTING``).
    Raises:
        ValueError: ``obj_pos_id_relative`` is False (the reference release forbids the absolute variant).
    """

    def __init__(self, config, language_state_dict=None, gradient_checkpointing=False):
        super().__init__()
        if not config.obj_pos_id_relative:
            raise ValueError("NETWORK.VLBERT.obj_pos_id_relative=False is not supported: the reference release "
                             "forbids object/[END] position ids 510/511")
        self.config = config
        hidden = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, hidden)
        self.end_embedding = nn.Embedding(1, hidden)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, hidden)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, hidden)
        self.embedding_LayerNorm = LayerNorm(hidden)
        self.embedding_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.position_padding_idx = config.position_padding_idx
        # Text positions 0 .. T-1, the RoIs' T, [END]'s T + 1, all shifted by position_padding_idx + 1.
        self.max_text_tokens = config.max_position_embeddings - config.position_padding_idx - 3

        self.visual_1x1_text = None
        self.visual_1x1_object = None
        if config.visual_size != hidden:
            self.visual_1x1_text = nn.Linear(config.visual_size, hidden)
            self.visual_1x1_object = nn.Linear(config.visual_size, hidden)
        if config.visual_ln:
            self.visual_ln_text = LayerNorm(hidden)
            self.visual_ln_object = LayerNorm(hidden)
        else:
            self.visual_scale_text = nn.Parameter(torch.tensor(float(config.visual_scale_text_init)))
            self.visual_scale_object = nn.Parameter(torch.tensor(float(config.visual_scale_object_init)))

        self.encoder = BertEncoder(config, gradient_checkpointing=gradient_checkpointing)
        if config.with_pooler:
            self.pooler = BertPooler(config)
        self.init_weights()
        if config.word_embedding_frozen:
            # Created after init_weights, as in the reference, so random initialisation draws are unchanged.
            self.word_embeddings.weight.requires_grad = False
            self.special_word_embeddings = nn.Embedding(NUM_SPECIAL_WORDS, hidden)
            self.copy_special_word_embeddings()
        if language_state_dict is not None:
            self.load_language_pretrained(language_state_dict)

    def init_weights(self):
        """BERT initialisation of all submodules; the visual LayerNorm gains start at ``visual_scale_*_init``."""
        self.apply(lambda m: init_bert_weights(m, self.config.initializer_range))
        if self.config.visual_ln:
            self.visual_ln_text.weight.data.fill_(self.config.visual_scale_text_init)
            self.visual_ln_object.weight.data.fill_(self.config.visual_scale_object_init)

    def copy_special_word_embeddings(self):
        """With ``word_embedding_frozen``, start the trainable special-word table from the first
        ``NUM_SPECIAL_WORDS`` rows of the word embeddings; called again after pretrained weights are loaded,
        so ``[CLS]``/``[SEP]``/``[MASK]`` start from BERT's vectors, as in the reference."""
        if self.config.word_embedding_frozen:
            self.special_word_embeddings.weight.data.copy_(self.word_embeddings.weight.data[:NUM_SPECIAL_WORDS])

    def language_parameters(self):
        """The parameters that hold BERT's weights (what ``NETWORK.BERT_FROZEN`` freezes): word, position
        and token-type embeddings, the embedding LayerNorm, the encoder, the pooler, and the trainable copy
        of the special words (``word_embedding_frozen``). The visual parts and ``end_embedding`` are not BERT's."""
        modules = [self.word_embeddings, self.position_embeddings, self.token_type_embeddings,
                   self.embedding_LayerNorm, self.encoder, getattr(self, 'pooler', None),
                   getattr(self, 'special_word_embeddings', None)]
        return [p for m in modules if m is not None for p in m.parameters()]

    def word_embedding(self, input_ids):
        """Word embeddings [..., H] of ``input_ids`` [...]; special words use their trainable copy when frozen."""
        embedded = self.word_embeddings(input_ids)
        if not self.config.word_embedding_frozen:
            return embedded
        special = input_ids < NUM_SPECIAL_WORDS
        special_embedded = self.special_word_embeddings(input_ids.clamp(max=NUM_SPECIAL_WORDS - 1))
        return torch.where(special.unsqueeze(-1), special_embedded, embedded)

    def _visual(self, features, projection, norm, scale):
        if projection is not None:
            features = projection(features)
        return norm(features) if self.config.visual_ln else features * scale

    def embedding(self, text_input_ids, text_token_type_ids, text_visual_embeddings, text_mask,
                  object_vl_embeddings, object_mask):
        """Build the packed input sequence.

        Args:
            text_input_ids: [B, Lt] long word ids.
            text_token_type_ids: [B, Lt] long segment ids (0 or 1).
            text_visual_embeddings: [B, Lt, visual_size] RoI feature grounding each text token.
            text_mask: [B, Lt] bool, valid text tokens (packed at the start of each row).
            object_vl_embeddings: [B, No, visual_size + H]: RoI feature then object-linguistic embedding.
            object_mask: [B, No] bool, valid RoIs.
        Returns:
            embeddings [B, L, H], attention mask [B, L] bool, text positions [B, L] bool,
            object positions [B, L] bool, with L = max over the batch of (#text + #objects) + 1.
        Raises:
            TextTooLongError: a row with more than :attr:`max_text_tokens` text tokens (names the rows).
        """
        text_vl = self.word_embedding(text_input_ids) + self._visual(
            text_visual_embeddings, self.visual_1x1_text, getattr(self, 'visual_ln_text', None),
            getattr(self, 'visual_scale_text', None))
        visual_size = self.config.visual_size
        object_vl = object_vl_embeddings[..., visual_size:] + self._visual(
            object_vl_embeddings[..., :visual_size], self.visual_1x1_object,
            getattr(self, 'visual_ln_object', None), getattr(self, 'visual_scale_object', None))

        batch = text_vl.shape[0]
        device = text_vl.device
        text_end = text_mask.sum(1, keepdim=True)
        if text_mask.shape[1] > self.max_text_tokens and not exporting():  # a padded length that may not fit
            self._check_text_length(text_end[:, 0])
        object_end = text_end + object_mask.sum(1, keepdim=True)
        longest = text_mask.shape[1] + object_mask.shape[1] if exporting() else int(object_end.max())
        length = longest + 1
        pos = torch.arange(length, device=device).unsqueeze(0)
        is_text = pos < text_end
        is_object = (pos >= text_end) & (pos < object_end)
        is_end = pos == object_end

        vl = text_vl.new_zeros((batch, length, text_vl.shape[-1]))
        vl[is_text] = text_vl[text_mask]
        vl[is_object] = object_vl[object_mask].to(vl.dtype)
        vl[is_end] = self.end_embedding.weight[0].to(vl.dtype)

        token_type_ids = text_token_type_ids.new_full((batch, length), 2)
        token_type_ids[is_text] = text_token_type_ids[text_mask]
        token_type_ids[pos > object_end] = 0

        # Objects share the position right after the text; [END] takes the next one.
        position_ids = torch.where(is_object, text_end, pos)
        position_ids = torch.where(is_end, text_end + 1, position_ids) + self.position_padding_idx + 1

        embeddings = vl + self.position_embeddings(position_ids) + self.token_type_embeddings(token_type_ids)
        embeddings = self.embedding_dropout(self.embedding_LayerNorm(embeddings))
        return embeddings, pos <= object_end, is_text, is_object

    def _check_text_length(self, lengths):
        """TextTooLongError when a row's text tokens (long ``[B]``) exceed :attr:`max_text_tokens` (the position
        embedding would be indexed out of range)."""
        over = (lengths > self.max_text_tokens).nonzero().flatten().tolist()
        if over:
            raise TextTooLongError(over, [int(lengths[r]) for r in over], len(lengths), self.max_text_tokens,
                                   self.config.max_position_embeddings)

    def forward(self, text_input_ids, text_token_type_ids, text_visual_embeddings, text_mask,
                object_vl_embeddings, object_mask, output_all_encoded_layers=True,
                output_text_and_object_separately=False, output_attention_probs=False):
        """Encode text and RoIs together (inputs as in ``embedding``).

        Returns, as in the reference release:
            - default: ``(encoded_layers, pooled)``: a list of [B, L, H] (all layers) or one [B, L, H]
              tensor when not ``output_all_encoded_layers``; ``pooled`` [B, H] or None without pooler;
            - ``output_text_and_object_separately``: ``(text, objects, pooled)`` with text [B, Lt, H] and
              objects [B, No, H] (zeros at padded RoIs), each a list when ``output_all_encoded_layers``;
            - ``output_attention_probs`` appends a list of per-layer [B, heads, L, L] probabilities.
        """
        embeddings, mask, is_text, is_object = self.embedding(
            text_input_ids, text_token_type_ids, text_visual_embeddings, text_mask, object_vl_embeddings,
            object_mask)
        encoded = self.encoder(embeddings, attention_bias(mask, embeddings.dtype),
                               output_all_encoded_layers=output_all_encoded_layers,
                               output_attention_probs=output_attention_probs)
        encoded_layers, attention_probs = encoded if output_attention_probs else (encoded, None)
        pooled = self.pooler(encoded_layers[-1]) if self.config.with_pooler else None

        if output_text_and_object_separately:
            text_len = text_input_ids.shape[1]
            texts, objects = [], []
            for layer in encoded_layers:
                # Text tokens are packed first; pad when the packed sequence is shorter than the text input.
                texts.append(F.pad(layer[:, :text_len], (0, 0, 0, max(0, text_len - layer.shape[1]))))
                obj = layer.new_zeros((layer.shape[0], object_mask.shape[1], layer.shape[2]))
                obj[object_mask] = layer[is_object]
                objects.append(obj)
            outputs = (texts, objects) if output_all_encoded_layers else (texts[0], objects[0])
        else:
            outputs = (encoded_layers if output_all_encoded_layers else encoded_layers[0],)
        outputs = outputs + (pooled,)
        if output_attention_probs:
            outputs = outputs + (attention_probs,)
        return outputs

    def load_language_pretrained(self, state_dict):
        """Copy pretrained BERT weights into the embeddings, encoder and pooler (and, with
        ``word_embedding_frozen``, the loaded special-word rows into their trainable copy).

        Args:
            state_dict: canonical BERT keys (``embeddings.*``, ``encoder.*``, ``pooler.*``; heads ``cls.*``
                are ignored here). A 1-row token-type table (RoBERTa) fills every segment row.
        Returns:
            list of keys that were not used.
        Raises:
            ValueError: a tensor's shape does not fit this model (message names the key and both shapes).
        """
        targets = {
            'embeddings.word_embeddings.weight': self.word_embeddings.weight,
            'embeddings.position_embeddings.weight': self.position_embeddings.weight,
            'embeddings.LayerNorm.weight': self.embedding_LayerNorm.weight,
            'embeddings.LayerNorm.bias': self.embedding_LayerNorm.bias,
        }
        targets.update({'encoder.' + k: v for k, v in self.encoder.state_dict(keep_vars=True).items()})
        if self.config.with_pooler:
            targets.update({'pooler.' + k: v for k, v in self.pooler.state_dict(keep_vars=True).items()})
        missing = [k for k in targets if k not in state_dict]
        if missing:
            raise ValueError("pretrained BERT weights lack {} key(s), e.g. {}".format(
                len(missing), missing[:5]))
        with torch.no_grad():
            for key, target in targets.items():
                _copy_checked(target, state_dict[key], key)
            token_types = state_dict.get('embeddings.token_type_embeddings.weight')
            if token_types is not None:
                rows = token_types.shape[0]
                _copy_checked(self.token_type_embeddings.weight[:rows], token_types,
                              'embeddings.token_type_embeddings.weight')
                if rows == 1:
                    self.token_type_embeddings.weight[1:] = token_types[0].to(self.token_type_embeddings.weight)
            self.copy_special_word_embeddings()
        used = set(targets) | {'embeddings.token_type_embeddings.weight'}
        return [k for k in state_dict if k not in used]


def _copy_checked(target, value, key):
    if tuple(target.shape) != tuple(value.shape):
        raise ValueError("pretrained BERT weight '{}' has shape {}, the model (NETWORK.VLBERT) expects {}".format(
            key, tuple(value.shape), tuple(target.shape)))
    target.data.copy_(value)


class VisualLinguisticBertForPretraining(VisualLinguisticBert):
    """VL-BERT with the pre-training heads (``relationsip_head``, ``mlm_head``, ``mvrc_head``).

    Args:
        config, language_state_dict, gradient_checkpointing: as ``VisualLinguisticBert``; pretrained
            ``cls.predictions.*`` and ``cls.seq_relationship.*`` weights, when present, initialise the MLM
            and relationship heads.
        with_rel_head, with_mlm_head, with_mvrc_head: which heads to build.
    """

    def __init__(self, config, language_state_dict=None, gradient_checkpointing=False,
                 with_rel_head=True, with_mlm_head=True, with_mvrc_head=True):
        super().__init__(config, language_state_dict=None, gradient_checkpointing=gradient_checkpointing)
        self.with_rel_head = with_rel_head
        self.with_mlm_head = with_mlm_head
        self.with_mvrc_head = with_mvrc_head
        if with_rel_head:
            self.relationsip_head = RelationshipHead(config)
        if with_mlm_head:
            self.mlm_head = BertOnlyMLMHead(config, self.word_embeddings.weight)
        if with_mvrc_head:
            self.mvrc_head = MVRCHead(config)
        self.init_weights()
        if language_state_dict is not None:
            self.load_language_pretrained(language_state_dict)
        if config.word_embedding_frozen:
            # The trainable copy of the special words starts from the (possibly pretrained) table.
            self.special_word_embeddings.weight.data.copy_(self.word_embeddings.weight.data[:NUM_SPECIAL_WORDS])
        if config.pos_embedding_frozen:
            self.position_embeddings.weight.requires_grad = False

    def forward(self, text_input_ids, text_token_type_ids, text_visual_embeddings, text_mask,
                object_vl_embeddings, object_mask):
        """Head logits for the last layer (inputs as in ``VisualLinguisticBert.embedding``).

        Returns:
            relationship [B, 2] or None, MLM [B, Lt, vocab] or None, MVRC [B, No, visual_region_classes] or None.
        """
        text, objects, pooled = super().forward(
            text_input_ids, text_token_type_ids, text_visual_embeddings, text_mask, object_vl_embeddings,
            object_mask, output_all_encoded_layers=False, output_text_and_object_separately=True)
        relationship = self.relationsip_head(pooled) if self.with_rel_head else None
        mlm = self.mlm_head(text) if self.with_mlm_head else None
        mvrc = self.mvrc_head(objects) if self.with_mvrc_head else None
        return relationship, mlm, mvrc

    def load_language_pretrained(self, state_dict):
        """As ``VisualLinguisticBert.load_language_pretrained``, plus the BERT MLM/NSP heads when present."""
        unused = super().load_language_pretrained(state_dict)
        heads = []
        if self.with_mlm_head:
            heads.append(('cls.predictions.', self.mlm_head.predictions))
        if self.with_rel_head:
            heads.append(('cls.seq_relationship.', self.relationsip_head.caption_image_relationship))
        for prefix, module in heads:
            weights = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
            if not weights:
                logger.warning("no '%s*' weights in the pretrained BERT: that head stays randomly initialised",
                               prefix)
                continue
            with torch.no_grad():
                for name, target in module.state_dict(keep_vars=True).items():
                    if name not in weights:
                        raise ValueError("pretrained BERT weights lack '{}{}'".format(prefix, name))
                    _copy_checked(target, weights[name], prefix + name)
            unused = [k for k in unused if not k.startswith(prefix)]
        return unused
