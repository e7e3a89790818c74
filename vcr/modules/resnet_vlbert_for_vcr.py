"""VL-BERT for Visual Commonsense Reasoning (paper section 4.2): score each answer (or rationale) choice."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from common.data.collate import TEXT_PAD
from common.errors import CheckpointError
from common.errors import UserInputError
from common.modeling.image_encoder import build_image_encoder
from common.modeling.nlp.heads import MVRCHeadTransform
from common.modeling.nlp.modeling import init_bert_weights
from common.modeling.nlp.time_distributed import TimeDistributed
from common.modeling.visual_linguistic_bert import VisualLinguisticBert
from common.modeling.vlbert_module import (NUM_OBJECT_CLASSES, VLBertModule, answer_classifier, collect_obj_reps,
                                  object_linguistic_embedding, pack_text_pair, valid_text_mask)


class ResNetVLBERT(VLBertModule):
    """Image encoder (Fast R-CNN or ViT) RoI features + VL-BERT run once per choice + a per-choice score.

    Batch (``vcr.data`` ``data_names``, Q2A; QA2R has rationale_* in the same places):

    - ``image`` [B, 3, H, W] float; ``boxes`` [B, N, 5+] float: x1, y1, x2, y2 (pixels, padded rows -1 in
      the 4th column), last column the object class; ``masks`` [B, N, h, w] segmentation masks;
    - ``question`` [B, Lq, 2] long: word id (0 = padding), object tag (-1 = none);
      ``question_align_matrix`` (unused);
    - ``answer_choices`` [B, C, La, 2] long as ``question``; ``answer_align_matrix`` (unused);
    - ``answer_label`` [B] long (training only); ``im_info`` [B, 4+] float (width, height, scales).

    ``train_forward(*batch) -> (outputs, loss)``, outputs: ``label_logits`` [B, C], ``label`` [B],
    ``ans_loss`` scalar (softmax cross-entropy with ``TRAIN.LABEL_SMOOTHING``, or the sigmoid loss), ``positive_fraction`` (sigmoid loss), ``cnn_regularization_loss``
    (``ENABLE_CNN_REG_LOSS``). ``inference_forward(*batch without answer_label) -> {'label_logits'}``.
    """

    def __init__(self, cfg):
        super().__init__(cfg)
        net = cfg.NETWORK
        vl = net.VLBERT
        if net.FOR_MASK_VL_MODELING_PRETRAIN:
            raise ValueError("NETWORK.FOR_MASK_VL_MODELING_PRETRAIN is not supported for VCR (nor in the reference)")
        if net.ANSWER_FIRST and net.QA_ONE_SENT:
            raise ValueError("NETWORK.ANSWER_FIRST with NETWORK.QA_ONE_SENT is not supported (nor in the reference)")
        if not vl.with_pooler:
            raise UserInputError("NETWORK.VLBERT.with_pooler: the VCR answer classifier reads the pooled [CLS] "
                                 "output; set it to true")
        # Blind models have no RoI features to regularise.
        self.enable_cnn_reg_loss = net.ENABLE_CNN_REG_LOSS and not net.BLIND
        self.cnn_loss_top = net.CNN_LOSS_TOP
        self.object_linguistic_embeddings = None
        if not net.BLIND:
            self.image_feature_extractor = build_image_encoder(
                cfg, average_pool=True, final_dim=net.IMAGE_FINAL_DIM,
                enable_cnn_reg_loss=self.enable_cnn_reg_loss and not self.cnn_loss_top)
            self.object_linguistic_embeddings = object_linguistic_embedding(vl)
            if self.enable_cnn_reg_loss and self.cnn_loss_top:
                self.cnn_loss_reg = nn.Sequential(MVRCHeadTransform(vl), nn.Dropout(net.CNN_REG_DROPOUT),
                                                  nn.Linear(vl.hidden_size, NUM_OBJECT_CLASSES))
        bert = VisualLinguisticBert(vl, gradient_checkpointing=net.GRADIENT_CHECKPOINTING)
        weights = self.language_weights()
        if weights is not None:
            self.report_unused(bert.load_language_pretrained(weights))
        self.vlbert = TimeDistributed(bert)
        self.final_mlp = answer_classifier(net, 1)
        self.init_weight()
        self.fix_params()

    def init_weight(self):
        if self.cfg.NETWORK.BLIND:
            return
        self.image_feature_extractor.init_weight()
        if self.object_linguistic_embeddings is not None:
            self.object_linguistic_embeddings.weight.data.normal_(mean=0.0, std=0.02)
        if hasattr(self, 'cnn_loss_reg'):
            self.cnn_loss_reg.apply(lambda m: init_bert_weights(m, self.cfg.NETWORK.VLBERT.initializer_range))

    def fix_params(self):
        self.apply_bert_frozen(self.vlbert._module)
        # Blind models see all-zero visual features: keep their visual scale/LayerNorm fixed.
        if self.cfg.NETWORK.BLIND:
            bert = self.vlbert._module
            for name in ('visual_scale_text', 'visual_scale_object', 'visual_ln_text', 'visual_ln_object'):
                if hasattr(bert, name):
                    getattr(bert, name).requires_grad_(False)

    def _encode(self, image, boxes, masks, question, answers, im_info):
        """Shared forward: returns logits [B, C], object states [B, C, N, H], classes [B, N], RoI mask, CNN outputs."""
        net = self.cfg.NETWORK
        classes = boxes[:, :, -1]
        coords = boxes[:, :, :4]
        box_mask = coords[:, :, -1] > -0.5
        max_len = int(box_mask.sum(1).max())
        classes, box_mask, coords, masks = classes[:, :max_len], box_mask[:, :max_len], coords[:, :max_len], \
            masks[:, :max_len]
        if net.BLIND:
            cnn = {'obj_reps': coords.new_zeros((*box_mask.shape, net.IMAGE_FINAL_DIM))}
        else:
            cnn = self.image_feature_extractor(images=image, boxes=coords, box_mask=box_mask, im_info=im_info,
                                               classes=classes, segms=masks)
        obj_reps = cnn['obj_reps']

        num_choices = answers.shape[1]
        question = question.unsqueeze(1).expand(-1, num_choices, -1, -1)
        q = (question[..., 0], question[..., 1], valid_text_mask(question[..., 0], TEXT_PAD))
        a = (answers[..., 0], answers[..., 1], valid_text_mask(answers[..., 0], TEXT_PAD))
        first, second = (a, q) if net.ANSWER_FIRST else (q, a)
        text_ids, text_types, text_tags, text_mask, _ = pack_text_pair(
            *first, *second, self.special_ids['[CLS]'], self.special_ids['[SEP]'], one_sentence=net.QA_ONE_SENT)
        if net.NO_GROUNDING:
            text_tags = torch.zeros_like(text_tags)
        text_visual = collect_obj_reps(text_tags, obj_reps)

        hidden = self.cfg.NETWORK.VLBERT.hidden_size
        objects_shape = (coords.shape[0], num_choices, max_len, hidden)
        if net.BLIND:
            object_linguistic = obj_reps.new_zeros(objects_shape)
        elif self.object_linguistic_embeddings is not None:
            rows = self.object_linguistic_embeddings.num_embeddings
            object_linguistic = self.object_linguistic_embeddings(classes.long().clamp(0, rows - 1))
            object_linguistic = object_linguistic.unsqueeze(1).expand(objects_shape)
        else:
            # Mode 3: the mean word embedding of the choice's text (without [CLS]/[SEP]) for every RoI.
            context = text_mask & (text_ids != self.special_ids['[CLS]']) & (text_ids != self.special_ids['[SEP]'])
            words = self.vlbert._module.word_embeddings(text_ids) * context.unsqueeze(-1)
            mean = words.sum(2) / context.sum(2, keepdim=True).to(words.dtype)
            object_linguistic = mean.unsqueeze(2).expand(objects_shape)
        object_vl = torch.cat((obj_reps.unsqueeze(1).expand(-1, num_choices, -1, -1),
                               object_linguistic.to(obj_reps.dtype)), -1)

        attended = torch.zeros_like(box_mask) if (net.NO_OBJ_ATTENTION or net.BLIND) else box_mask
        attended = attended.unsqueeze(1).expand(-1, num_choices, -1)
        _, object_states, pooled = self.vlbert(text_ids, text_types, text_visual, text_mask, object_vl, attended,
                                               output_all_encoded_layers=False,
                                               output_text_and_object_separately=True)
        logits = self.final_mlp(pooled).squeeze(2)
        return logits, object_states, classes, attended, cnn

    def train_forward(self, image, boxes, masks, question, question_align_matrix, answer_choices,
                      answer_align_matrix, answer_label, im_info):
        net = self.cfg.NETWORK
        logits, object_states, classes, attended, cnn = self._encode(image, boxes, masks, question,
                                                                     answer_choices, im_info)
        label = answer_label.long().view(-1)
        outputs = {}
        if net.CLASSIFIER_SIGMOID:
            target = F.one_hot(label, logits.shape[1]).to(logits.dtype)
            positive_weight = net.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT
            # Weighted BCE rescaled so that the loss scale does not depend on the positive weight.
            weight = 1.0 + (positive_weight - 1.0) * target
            rescale = (positive_weight + 1.0) / (2.0 * positive_weight)
            ans_loss = rescale * F.binary_cross_entropy_with_logits(logits, target, weight=weight)
            outputs['positive_fraction'] = target.mean()
        else:
            ans_loss = F.cross_entropy(logits, label, label_smoothing=self.cfg.TRAIN.LABEL_SMOOTHING)
        outputs.update(label_logits=logits, label=label, ans_loss=ans_loss)
        loss = ans_loss.mean() * net.ANS_LOSS_WEIGHT

        if self.enable_cnn_reg_loss:
            if self.cnn_loss_top:
                num_choices = logits.shape[1]
                reg_logits = self.cnn_loss_reg(object_states[attended])
                reg_labels = classes.long().unsqueeze(1).expand(-1, num_choices, -1)[attended]
                # Sum / count: a batch whose RoIs are all hidden gives 0, not NaN.
                cnn_loss = F.cross_entropy(reg_logits.float(), reg_labels, reduction='sum') / max(len(reg_labels), 1)
            else:
                cnn_loss = cnn['cnn_regularization_loss']
            outputs['cnn_regularization_loss'] = cnn_loss
            loss = loss + cnn_loss.mean() * net.CNN_LOSS_WEIGHT
        return outputs, loss

    def inference_forward(self, image, boxes, masks, question, question_align_matrix, answer_choices,
                          answer_align_matrix, im_info):
        logits, _, _, _, _ = self._encode(image, boxes, masks, question, answer_choices, im_info)
        return {'label_logits': logits}


# Renames of a pretraining checkpoint for this model (NETWORK.PARTIAL_PRETRAIN; as timm's checkpoint_filter_fn,
# they live next to the model they rename). The pretraining relationship head (the reference's spelling) and
# the VCR classifier it becomes:
REL_HEAD = "vlbert.relationsip_head.caption_image_relationship"
VCR_CLASSIFIER = "final_mlp.1"
TOKEN_TYPE_EMBEDDINGS = "vlbert._module.token_type_embeddings.weight"


def pretrain_renames(parsed, raw, source, segmb_init=False, load_rel_head=False):
    """VCR's renames of a pretraining state dict, after the prefix changes (as the reference did).

    * ``load_rel_head`` and a relationship head in the file: the VCR classifier ``final_mlp.1``
      gets ``W[1:2] - W[0:1]`` and ``b[1:2] - b[0:1]`` of the 2-way caption-image head (the logit
      difference of "matched" over "not matched").
    * ``segmb_init``: row 1 of the token-type embeddings copies row 0.

    Args:
        parsed: renamed fp32 tensors; raw: the file's tensors (``module.`` removed); source: file name.
    Returns:
        ``parsed`` with the changes above.
    Raises:
        common.errors.CheckpointError: ``segmb_init`` but no token-type embeddings after renaming.
    """
    if load_rel_head and REL_HEAD + ".weight" in raw:
        for suffix in (".weight", ".bias"):
            w = raw[REL_HEAD + suffix].float()
            parsed[VCR_CLASSIFIER + suffix] = w[1:2] - w[0:1]
    if segmb_init:
        if TOKEN_TYPE_EMBEDDINGS not in parsed:
            raise CheckpointError("NETWORK.PARTIAL_PRETRAIN_SEGMB_INIT: {} has no {} after the prefix changes"
                                  .format(source, TOKEN_TYPE_EMBEDDINGS))
        emb = parsed[TOKEN_TYPE_EMBEDDINGS].clone()
        emb[1] = emb[0]
        parsed[TOKEN_TYPE_EMBEDDINGS] = emb
    return parsed
