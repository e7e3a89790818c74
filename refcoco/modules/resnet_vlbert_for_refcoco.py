"""VL-BERT for referring expressions (paper section 4.4, RefCOCO+): one score per candidate box."""
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.modeling.image_encoder import build_image_encoder
from common.modeling.nlp.heads import MVRCHeadTransform
from common.modeling.visual_linguistic_bert import VisualLinguisticBert
from common.modeling.vlbert_module import VLBertModule, collect_obj_reps, object_linguistic_embedding

# Logit given to padded box slots, so that no argmax ever picks one (the reference's fill value).
PADDED_LOGIT = -10000.0


def pack_expression(expression, cls_id, sep_id):
    """BERT input ``[CLS] expression [SEP]`` of one segment.

    Args:
        expression: ``[B, L]`` long word-piece ids, valid ids first, padded with 0.
        cls_id, sep_id: ids of ``[CLS]`` and ``[SEP]``.
    Returns:
        ``input_ids`` ``[B, L + 2]`` long and ``mask`` ``[B, L + 2]`` bool (True up to and with ``[SEP]``).
    """
    batch, length = expression.shape
    lengths = (expression > 0).sum(1, keepdim=True)
    positions = torch.arange(length + 2, device=expression.device)
    input_ids = expression.new_zeros((batch, length + 2))
    input_ids[:, 0] = cls_id
    input_ids[:, 1:-1] = expression.clamp(min=0)
    sep = positions == lengths + 1
    input_ids[sep] = sep_id
    return input_ids, positions <= lengths + 1


class ResNetVLBERT(VLBertModule):
    """Image encoder (Fast R-CNN or ViT) RoI features of the candidate boxes + VL-BERT over ``[CLS] expression [SEP]`` and the boxes
    + a per-box logit from the box's output state (``final_mlp``: the pretraining MVRC transform, dropout,
    linear; ``PARTIAL_PRETRAIN_PREFIX_CHANGES`` map ``vlbert.mvrc_head.transform`` onto ``final_mlp.0``).

    Every text token carries the feature of box 0 (the whole image with ``DATASET.ADD_IMAGE_AS_A_BOX``), every
    box the one class-agnostic object embedding, as in the reference. State-dict keys and shapes equal the
    reference release's ``refcoco/modules/resnet_vlbert_for_refcoco.py``.

    Batch (``refcoco.data`` ``data_names``): ``image`` [B, 3, H, W] float; ``boxes`` [B, N, 4] float
    ``x1, y1, x2, y2`` pixels of the resized image, padded rows negative (x1 < 0); ``im_info`` [B, 4 or 5]
    float ``width, height, scale_x, scale_y[, dataset index]``; ``expression`` [B, L] long word-piece ids
    (0 = padding); ``label`` [B, N] float 0/1 (training only).

    ``train_forward(*batch) -> (outputs, loss)``: ``label_logits`` [B, N] (``PADDED_LOGIT`` at padded slots),
    ``label`` [B, N] (-1 at padded slots), ``cls_loss`` (binary cross-entropy with logits, mean over all valid
    boxes of the batch) and ``loss = cls_loss``. ``inference_forward(image, boxes, im_info, expression)``:
    ``label_logits``, ``pred_boxes`` [B, 4] (the argmax box in original image pixels: divided by the scales)
    and, when ``im_info`` has 5 columns, ``index`` [B] long.

    ``NETWORK.BLIND`` (a baseline): every pixel is set to 0, the mean colour after normalisation, so the box
    features carry the boxes' geometry (and the image size) but nothing of what the boxes show.

    Raises:
        ValueError: ``NETWORK.VLBERT.object_word_embed_mode`` is not 2 (the reference's one embedding row).
    """

    def __init__(self, cfg):
        super().__init__(cfg)
        net = cfg.NETWORK
        vl = net.VLBERT
        if vl.object_word_embed_mode != 2:
            raise ValueError("RefCOCO+ needs NETWORK.VLBERT.object_word_embed_mode 2 (one class-agnostic box "
                             "embedding), got {}".format(vl.object_word_embed_mode))
        if net.ENABLE_CNN_REG_LOSS:
            warnings.warn("NETWORK.ENABLE_CNN_REG_LOSS is ignored for RefCOCO+ (boxes have no class labels; the "
                          "reference ignores it too)")
        self.image_feature_extractor = build_image_encoder(cfg, average_pool=True, final_dim=net.IMAGE_FINAL_DIM,
                                                           enable_cnn_reg_loss=False)
        self.object_linguistic_embeddings = object_linguistic_embedding(vl)
        self.vlbert = VisualLinguisticBert(vl, gradient_checkpointing=net.GRADIENT_CHECKPOINTING)
        weights = self.language_weights()
        if weights is not None:
            self.report_unused(self.vlbert.load_language_pretrained(weights))
        self.final_mlp = nn.Sequential(MVRCHeadTransform(vl), nn.Dropout(net.CLASSIFIER_DROPOUT),
                                       nn.Linear(vl.hidden_size, 1))
        self.init_weight()

    def init_weight(self):
        self.image_feature_extractor.init_weight()
        std = self.cfg.NETWORK.VLBERT.initializer_range
        self.object_linguistic_embeddings.weight.data.normal_(mean=0.0, std=std)
        for m in self.final_mlp.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def _logits(self, image, boxes, im_info, expression):
        """Box logits ``[B, N]`` (``PADDED_LOGIT`` at padded slots) and the box mask ``[B, N]``."""
        if self.cfg.NETWORK.BLIND:
            image = torch.zeros_like(image)  # the mean colour everywhere: box geometry without content
        box_mask = boxes[:, :, 0] > -0.5  # padded rows are -1 (common collate) or -2 (reference collate)
        num_boxes = boxes.shape[1]
        max_len = int(box_mask.sum(1).max())
        box_mask, coords = box_mask[:, :max_len], boxes[:, :max_len, :4]
        obj_reps = self.image_feature_extractor(images=image, boxes=coords, box_mask=box_mask,
                                                im_info=im_info)['obj_reps']

        text_ids, text_mask = pack_expression(expression.long(), self.special_ids['[CLS]'], self.special_ids['[SEP]'])
        text_visual = collect_obj_reps(torch.zeros_like(text_ids), obj_reps)
        object_linguistic = self.object_linguistic_embeddings(box_mask.new_zeros(box_mask.shape, dtype=torch.long))
        object_vl = torch.cat((obj_reps, object_linguistic.to(obj_reps.dtype)), -1)
        _, object_states, _ = self.vlbert(text_ids, torch.zeros_like(text_ids), text_visual, text_mask, object_vl,
                                          box_mask, output_all_encoded_layers=False,
                                          output_text_and_object_separately=True)
        logits = self.final_mlp(object_states).squeeze(-1).masked_fill(~box_mask, PADDED_LOGIT)
        return F.pad(logits, (0, num_boxes - max_len), value=PADDED_LOGIT), F.pad(box_mask, (0, num_boxes - max_len))

    def train_forward(self, image, boxes, im_info, expression, label):
        logits, box_mask = self._logits(image, boxes, im_info, expression)
        label = label.to(logits.dtype)
        cls_loss = F.binary_cross_entropy_with_logits(logits[box_mask].float(), label[box_mask].float())
        outputs = {'label_logits': logits, 'label': label.masked_fill(~box_mask, -1.0), 'cls_loss': cls_loss}
        return outputs, cls_loss

    def inference_forward(self, image, boxes, im_info, expression):
        logits, _ = self._logits(image, boxes, im_info, expression)
        batch = torch.arange(boxes.shape[0], device=boxes.device)
        scales = im_info[:, [2, 3, 2, 3]].to(boxes.dtype)
        outputs = {'label_logits': logits, 'pred_boxes': boxes[batch, logits.argmax(1), :4] / scales}
        if im_info.shape[1] >= 5:
            outputs['index'] = im_info[:, 4].long()
        return outputs
