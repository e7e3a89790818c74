"""VL-BERT for VQA (paper section 4.3): classify the answer from the output at a [MASK] after the question."""
import warnings

import torch
import torch.nn.functional as F

from common.data.collate import TEXT_PAD
from common.errors import UserInputError
from common.modeling.image_encoder import build_image_encoder
from common.modeling.module import exporting
from common.modeling.visual_linguistic_bert import VisualLinguisticBert
from common.modeling.vlbert_module import (VLBertModule, answer_classifier, collect_obj_reps, object_linguistic_embedding,
                                  pack_text_pair, valid_text_mask)

MLM_TRANSFORM_PREFIX = 'cls.predictions.transform.'
ANS_LOSS_TYPES = ('bce', 'ce')


def box_mask(boxes):
    """Which box rows are real: ``boxes`` float [B, N, 4+] (padded rows hold -2, the VQA data's pad
    value; real coordinates are >= 0) -> bool [B, N]."""
    return boxes[:, :, 0] > -1.5


def smoothed_soft_targets(target, smoothing):
    """Label smoothing of unnormalised soft targets (VQA's answer scores), for a softmax cross-entropy.

    ``F.cross_entropy(..., label_smoothing=e)`` mixes each target row with ``e / C`` per class, which
    assumes rows that sum to 1: a VQA row of scores summing to ``S`` (0 for a question whose answers
    are all outside the vocabulary, up to several for a few accepted answers) would get ``e`` of
    uniform mass whatever ``S``, so an unlabelled row would be trained towards the uniform
    distribution. Here each row keeps its mass: a fraction ``e`` of it is spread evenly,

        smoothed = (1 - e) * target + e * S / C,      S = target.sum(1)

    so a row summing to 1 gives exactly ``F.cross_entropy(logits, target, label_smoothing=e)``, a
    row summing to 0 still adds no loss, and ``e = 0`` returns ``target`` itself.

    Args:
        target: [N, C] float, non-negative soft scores.
        smoothing: ``TRAIN.LABEL_SMOOTHING``, in [0, 1].
    Returns:
        [N, C] tensor of ``target``'s dtype (``target`` when ``smoothing`` is 0).
    """
    if smoothing == 0.0:
        return target
    return target * (1.0 - smoothing) + target.sum(1, keepdim=True) * (smoothing / target.shape[1])


class ResNetVLBERT(VLBertModule):
    """Input ``[CLS] question [SEP] [MASK] [SEP]`` + RoIs; answer logits from the [MASK] position.

    Batch (``vqa.data`` ``data_names``): ``image`` [B, 3, H, W]; ``boxes`` [B, N, 4] float pixels (padded
    rows -2); ``im_info`` [B, 4+]; ``question`` [B, Lq] long word ids (0 = padding); ``label`` [B, A]
    float soft scores (training only), A = ``DATASET.ANSWER_VOCAB_SIZE``.

    ``NETWORK.BLIND``: no image parameters; the objects are zeros and the text attends none (the
    question alone). ``NETWORK.NO_OBJ_ATTENTION``: the text attends no object (the image reaches the
    text only through the whole-image box's feature added to each word). ``NETWORK.NO_GROUNDING``:
    that feature is zero.

    ``train_forward(*batch) -> (outputs, loss)``, outputs: ``label_logits`` [B, A], ``label`` [B, A],
    ``ans_loss`` by ``NETWORK.ANS_LOSS_TYPE``: 'bce', binary cross-entropy with the soft scores summed over
    answers (the reference's: mean over batch and answers times A); 'ce', softmax cross-entropy against the
    soft scores, ``-sum_a label_a * log_softmax(logits)_a``, with ``TRAIN.LABEL_SMOOTHING`` applied by
    :func:`smoothed_soft_targets` (a row's mass is kept); both averaged over the batch.
    ``inference_forward(image, boxes, im_info, question) -> {'label_logits'}``.
    """

    def __init__(self, cfg):
        super().__init__(cfg)
        net = cfg.NETWORK
        if net.ANS_LOSS_TYPE not in ANS_LOSS_TYPES:
            raise UserInputError("NETWORK.ANS_LOSS_TYPE: expected one of {}, got {!r}".format(
                ", ".join(ANS_LOSS_TYPES), net.ANS_LOSS_TYPE))
        if net.VLBERT.object_word_embed_mode != 2:
            raise ValueError("VQA needs NETWORK.VLBERT.object_word_embed_mode 2 (class-agnostic RoI embedding), "
                             "got {}".format(net.VLBERT.object_word_embed_mode))
        if not net.BLIND:  # as the reference: a blind model has no image parameters
            self.image_feature_extractor = build_image_encoder(cfg, average_pool=True, final_dim=net.IMAGE_FINAL_DIM,
                                                               enable_cnn_reg_loss=net.ENABLE_CNN_REG_LOSS)
            self.object_linguistic_embeddings = object_linguistic_embedding(net.VLBERT)
        self.vlbert = VisualLinguisticBert(net.VLBERT, gradient_checkpointing=net.GRADIENT_CHECKPOINTING)
        weights = self.language_weights()
        if weights is not None:
            self.report_unused(self.vlbert.load_language_pretrained(weights))
        self.final_mlp = answer_classifier(net, cfg.DATASET.ANSWER_VOCAB_SIZE)
        self.init_weight()
        if net.CLASSIFIER_TYPE == 'mlm':
            self._load_mlm_transform(weights)
        self.apply_bert_frozen(self.vlbert)

    def init_weight(self):
        if not self.cfg.NETWORK.BLIND:
            self.image_feature_extractor.init_weight()
            self.object_linguistic_embeddings.weight.data.normal_(mean=0.0, std=0.02)

    def _load_mlm_transform(self, weights):
        transform = {k[len(MLM_TRANSFORM_PREFIX):]: v for k, v in (weights or {}).items()
                     if k.startswith(MLM_TRANSFORM_PREFIX)}
        if not transform:
            warnings.warn("CLASSIFIER_TYPE 'mlm': no '{}*' weights in the pretrained BERT; the classifier transform "
                          "stays randomly initialised".format(MLM_TRANSFORM_PREFIX))
            return
        self.final_mlp[0].load_state_dict(transform)

    def _logits(self, image, boxes, im_info, question):
        net = self.cfg.NETWORK
        mask = box_mask(boxes)
        if not exporting():
            max_len = int(mask.sum(1).max())
            mask, boxes = mask[:, :max_len], boxes[:, :max_len]
        if net.BLIND:
            obj_reps = boxes.new_zeros((*mask.shape, net.IMAGE_FINAL_DIM))
        else:
            obj_reps = self.image_feature_extractor(images=image, boxes=boxes, box_mask=mask, im_info=im_info)
            obj_reps = obj_reps['obj_reps']

        question_tags = torch.zeros_like(question)
        answer = question.new_full((question.shape[0], 1), self.special_ids['[MASK]'])
        text_ids, text_types, text_tags, text_mask, answer_pos = pack_text_pair(
            question, question_tags, valid_text_mask(question, TEXT_PAD), answer, torch.zeros_like(answer),
            torch.ones_like(answer, dtype=torch.bool), self.special_ids['[CLS]'], self.special_ids['[SEP]'])
        text_visual = collect_obj_reps(text_tags, obj_reps)
        if net.NO_GROUNDING:
            text_visual = torch.zeros_like(text_visual)
        if net.BLIND:
            object_linguistic = obj_reps.new_zeros((*mask.shape, net.VLBERT.hidden_size))
        else:
            object_linguistic = self.object_linguistic_embeddings(mask.new_zeros(mask.shape, dtype=torch.long))
        object_vl = torch.cat((obj_reps, object_linguistic.to(obj_reps.dtype)), -1)
        attended = torch.zeros_like(mask) if (net.NO_OBJ_ATTENTION or net.BLIND) else mask

        hidden, _ = self.vlbert(text_ids, text_types, text_visual, text_mask, object_vl, attended,
                                output_all_encoded_layers=False)
        answer_states = hidden[torch.arange(hidden.shape[0], device=hidden.device), answer_pos]
        return self.final_mlp(answer_states)

    def train_forward(self, image, boxes, im_info, question, label):
        logits = self._logits(image, boxes, im_info, question)
        target = label.to(logits.dtype)
        if self.cfg.NETWORK.ANS_LOSS_TYPE == 'ce':
            # class-probability targets: -sum(target * log_softmax), smoothed keeping each row's mass
            ans_loss = F.cross_entropy(logits, smoothed_soft_targets(target, self.cfg.TRAIN.LABEL_SMOOTHING))
        else:
            # Reference scaling: mean over batch and answers, times the number of answers.
            ans_loss = F.binary_cross_entropy_with_logits(logits, target) * label.shape[1]
        outputs = {'label_logits': logits, 'label': label, 'ans_loss': ans_loss}
        return outputs, ans_loss.mean()

    def inference_forward(self, image, boxes, im_info, question):
        return {'label_logits': self._logits(image, boxes, im_info, question)}
