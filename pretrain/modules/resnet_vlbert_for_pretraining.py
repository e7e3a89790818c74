"""VL-BERT pre-training (paper section 3.2): masked language modelling with visual clues, masked RoI
classification with linguistic clues, and (optionally) caption-image relationship prediction."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from common.modeling.image_encoder import build_image_encoder
from pretrain.losses import masked_lm_loss, mvrc_loss, pad_to, reported_loss
from common.modeling.visual_linguistic_bert import VisualLinguisticBertForPretraining
from common.modeling.vlbert_module import VLBertModule, collect_obj_reps, valid_text_mask

# Logit given to padded MLM/MVRC positions so that padded outputs keep the batch's full shape.
PAD_LOGIT = -10000.0


class ResNetVLBERTForPretraining(VLBertModule):
    """Pre-training on image-caption pairs (Conceptual Captions).

    Batch (``pretrain.data`` ``data_names``): ``image`` [B, 3, H, W]; ``boxes`` [B, N, 4] float pixels
    (padded rows -2; with ``IMAGE_FEAT_PRECOMPUTED`` [B, N, 4 + 2048] with the box features);
    ``im_info`` [B, 4+]; ``text`` [B, L] long word ids (0 = padding); ``relationship_label`` [B] long;
    ``mlm_labels`` [B, L] long (-1 = not masked); ``mvrc_ops`` [B, N] long (1 = RoI masked);
    ``mvrc_labels`` [B, N, 1601] float class distribution at masked RoIs.

    ``forward(*batch) -> (outputs, loss)`` in train and eval mode. Outputs: ``relationship_logits`` [B, 2],
    ``relationship_label``, ``mlm_logits`` [B, L, vocab], ``mlm_label``, ``mvrc_logits`` [B, N, 1601],
    ``mvrc_label`` (each None when its loss is off), ``relationship_loss``, ``mlm_loss``, ``mvrc_loss``.
    """

    def __init__(self, cfg):
        super().__init__(cfg)
        net = cfg.NETWORK
        hidden = net.VLBERT.hidden_size
        self.image_feature_extractor = build_image_encoder(cfg, average_pool=True, final_dim=net.IMAGE_FINAL_DIM,
                                                           enable_cnn_reg_loss=False)
        self.object_linguistic_embeddings = nn.Embedding(1, hidden)
        if self.masks_visual_embedding():
            # As wide as the box features it replaces: 2048 precomputed (and ResNet-50+), a ViT's embedding width.
            self.object_mask_visual_embedding = nn.Embedding(1, self.image_feature_extractor.feat_dim)
        if net.WITH_MVRC_LOSS:
            self.object_mask_word_embedding = nn.Embedding(1, hidden)
        self.build_extra_embeddings()
        weights = None if net.VLBERT.from_scratch else self.language_weights()
        self.vlbert = VisualLinguisticBertForPretraining(
            net.VLBERT, gradient_checkpointing=net.GRADIENT_CHECKPOINTING, with_rel_head=net.WITH_REL_LOSS,
            with_mlm_head=net.WITH_MLM_LOSS, with_mvrc_head=net.WITH_MVRC_LOSS)
        if weights is not None:
            self.report_unused(self.vlbert.load_language_pretrained(weights))
        self.init_weight()
        self.apply_bert_frozen(self.vlbert)

    def masks_visual_embedding(self):
        """Whether masked RoIs get a learnt visual feature (here: only with precomputed features)."""
        return self.cfg.NETWORK.IMAGE_FEAT_PRECOMPUTED

    def build_extra_embeddings(self):
        """Hook for subclasses to add embeddings before ``vlbert`` (keeps the reference's parameter order)."""

    def init_weight(self):
        std = self.cfg.NETWORK.VLBERT.initializer_range
        if self.masks_visual_embedding():
            self.object_mask_visual_embedding.weight.data.zero_()
        if self.cfg.NETWORK.WITH_MVRC_LOSS:
            self.object_mask_word_embedding.weight.data.normal_(mean=0.0, std=std)
        self.image_feature_extractor.init_weight()
        self.object_linguistic_embeddings.weight.data.normal_(mean=0.0, std=std)

    def forward(self, *batch):
        return self.pretrain_forward(*batch)

    def encode_objects(self, image, boxes, im_info, mvrc_ops):
        """RoI inputs: ([B, N', visual + H] object embeddings, [B, N'] mask, N'), N' = most RoIs in the batch."""
        net = self.cfg.NETWORK
        box_mask = boxes[:, :, 0] > -1.5
        max_len = int(box_mask.sum(1).max())
        box_mask, boxes, mvrc_ops = box_mask[:, :max_len], boxes[:, :max_len], mvrc_ops[:, :max_len]
        if net.IMAGE_FEAT_PRECOMPUTED:
            masked = (mvrc_ops == 1).unsqueeze(-1)
            features = torch.where(masked, self.object_mask_visual_embedding.weight[0].to(boxes.dtype), boxes[..., 4:])
            boxes = torch.cat((boxes[..., :4], features), -1)
        # Raw-pixel masking happens in the data pipeline; otherwise the image encoder swaps in the learnt feature.
        mask_visual = None
        if self.masks_visual_embedding() and not net.IMAGE_FEAT_PRECOMPUTED:
            mask_visual = self.object_mask_visual_embedding.weight[0]
        obj_reps = self.image_feature_extractor(images=image, boxes=boxes, box_mask=box_mask, im_info=im_info,
                                                mvrc_ops=mvrc_ops, mask_visual_embed=mask_visual)['obj_reps']
        linguistic = self.object_linguistic_embeddings(torch.zeros_like(mvrc_ops, dtype=torch.long))
        if net.WITH_MVRC_LOSS:
            linguistic = torch.where((mvrc_ops == 1).unsqueeze(-1), self.object_mask_word_embedding.weight[0],
                                     linguistic)
        return torch.cat((obj_reps, linguistic.to(obj_reps.dtype)), -1), box_mask, obj_reps

    def pretrain_forward(self, image, boxes, im_info, text, relationship_label, mlm_labels, mvrc_ops, mvrc_labels):
        net = self.cfg.NETWORK
        num_boxes = boxes.shape[1]
        object_vl, box_mask, obj_reps = self.encode_objects(image, boxes, im_info, mvrc_ops)
        text_tags = torch.zeros_like(text)
        relationship_logits, mlm_logits, mvrc_logits = self.vlbert(
            text, torch.zeros_like(text), collect_obj_reps(text_tags, obj_reps), valid_text_mask(text), object_vl,
            box_mask)

        outputs = {'relationship_logits': None, 'relationship_label': None, 'mlm_logits': None, 'mlm_label': None,
                   'mvrc_logits': None, 'mvrc_label': None}
        zero = im_info.new_zeros(())
        relationship_loss = mlm_loss = mvrc = zero
        if net.WITH_REL_LOSS:
            relationship_loss = F.cross_entropy(relationship_logits, relationship_label)
            outputs.update(relationship_logits=relationship_logits, relationship_label=relationship_label)
        if net.WITH_MLM_LOSS:
            mlm_logits = pad_to(mlm_logits, mlm_labels.shape[1], 1, PAD_LOGIT)
            mlm_loss = masked_lm_loss(mlm_logits, mlm_labels, net.MLM_LOSS_NORM_IN_BATCH_FIRST)
            outputs.update(mlm_logits=mlm_logits, mlm_label=mlm_labels)
        if net.WITH_MVRC_LOSS:
            mvrc_labels = mvrc_labels[:, :mvrc_logits.shape[1]]
            mvrc = mvrc_loss(mvrc_logits, mvrc_labels, net.MVRC_LOSS_NORM_IN_BATCH_FIRST)
            outputs.update(mvrc_logits=pad_to(mvrc_logits, num_boxes, 1, PAD_LOGIT),
                           mvrc_label=pad_to(mvrc_labels, num_boxes, 1, 0.0))
        outputs.update(relationship_loss=relationship_loss, mlm_loss=reported_loss(mlm_loss, outputs['mlm_label']),
                       mvrc_loss=reported_loss(mvrc, outputs['mvrc_label']))
        return outputs, relationship_loss.mean() + mlm_loss.mean() + mvrc.mean()
