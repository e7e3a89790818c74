"""VL-BERT pre-training on image-caption pairs plus text-only corpora (paper section 3.2: Conceptual
Captions with BooksCorpus and English Wikipedia for the MLM task)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from pretrain.losses import masked_lm_loss, mvrc_loss, pad_to, reported_loss
from common.modeling.vlbert_module import collect_obj_reps, valid_text_mask
from .resnet_vlbert_for_pretraining import PAD_LOGIT, ResNetVLBERTForPretraining


def concat_padded(tensors, fill):
    """Stack [n_i, L_i] tensors into [sum n_i, max L_i], padding with ``fill``."""
    length = max(t.shape[1] for t in tensors)
    return torch.cat([pad_to(t, length, 1, fill) for t in tensors])


class ResNetVLBERTForPretrainingMultitask(ResNetVLBERTForPretraining):
    """``ResNetVLBERTForPretraining`` whose batch also carries text-only samples.

    Batch: the image-caption batch of ``ResNetVLBERTForPretraining`` followed by pairs
    ``aux_text_k`` [b_k, L_k] long, ``aux_mlm_labels_k`` [b_k, L_k] long, one pair per text corpus. Text-only
    samples see no RoIs and a learnt visual feature (``aux_text_visual_embedding``) on every token.

    ``forward(*batch) -> (outputs, loss)``. Outputs: ``relationship_logits``, ``relationship_label``,
    ``mlm_logits_wvc`` / ``mlm_label_wvc`` (image-caption MLM, [B, L, vocab] / [B, L]),
    ``mlm_logits_aux`` / ``mlm_label_aux`` (text-only MLM), ``mvrc_logits`` [B, N, 1601], ``mvrc_label``
    (None when that loss is off), ``relationship_loss``, ``mlm_loss_wvc``, ``mlm_loss_aux``, ``mvrc_loss``.
    """

    def masks_visual_embedding(self):
        net = self.cfg.NETWORK
        return net.IMAGE_FEAT_PRECOMPUTED or not net.MASK_RAW_PIXELS

    def build_extra_embeddings(self):
        self.aux_text_visual_embedding = nn.Embedding(1, self.cfg.NETWORK.VLBERT.hidden_size)

    def init_weight(self):
        super().init_weight()
        self.aux_text_visual_embedding.weight.data.normal_(mean=0.0,
                                                           std=self.cfg.NETWORK.VLBERT.initializer_range)

    def forward(self, image, boxes, im_info, text, relationship_label, mlm_labels, mvrc_ops, mvrc_labels, *aux):
        if len(aux) == 0 or len(aux) % 2:
            raise ValueError("ResNetVLBERTForPretrainingMultitask: expected (text, mlm_labels) pairs after the "
                             "image-caption batch, got {} extra tensors".format(len(aux)))
        net = self.cfg.NETWORK
        num_boxes = boxes.shape[1]
        aux_text = concat_padded(aux[0::2], 0)
        aux_labels = concat_padded(aux[1::2], -1)
        object_vl, box_mask, obj_reps = self.encode_objects(image, boxes, im_info, mvrc_ops)
        batch, num_aux = text.shape[0], aux_text.shape[0]

        all_text = concat_padded([text, aux_text], 0)
        text_visual = collect_obj_reps(torch.zeros_like(text), obj_reps)
        aux_visual = self.aux_text_visual_embedding.weight[0].to(text_visual.dtype).expand(
            num_aux, aux_text.shape[1], -1)
        text_visual = torch.cat([pad_to(v, all_text.shape[1], 1, 0.0) for v in (text_visual, aux_visual)])
        object_vl = torch.cat((object_vl, object_vl.new_zeros((num_aux, *object_vl.shape[1:]))))
        box_mask = torch.cat((box_mask, box_mask.new_zeros((num_aux, box_mask.shape[1]))))
        relationship_logits, mlm_logits, mvrc_logits = self.vlbert(
            all_text, torch.zeros_like(all_text), text_visual, valid_text_mask(all_text), object_vl, box_mask)

        outputs = {key: None for key in ('relationship_logits', 'relationship_label', 'mlm_logits_wvc',
                                         'mlm_label_wvc', 'mlm_logits_aux', 'mlm_label_aux', 'mvrc_logits',
                                         'mvrc_label')}
        zero = im_info.new_zeros(())
        relationship_loss = mlm_loss_wvc = mlm_loss_aux = mvrc = zero
        if net.WITH_REL_LOSS:
            relationship_logits = relationship_logits[:batch]
            relationship_loss = F.cross_entropy(relationship_logits, relationship_label)
            outputs.update(relationship_logits=relationship_logits, relationship_label=relationship_label)
        if net.WITH_MLM_LOSS:
            all_labels = concat_padded([mlm_labels, aux_labels], -1)
            mlm_logits = pad_to(mlm_logits, all_labels.shape[1], 1, PAD_LOGIT)
            wvc, aux_part = (mlm_logits[:batch], all_labels[:batch]), (mlm_logits[batch:], all_labels[batch:])
            mlm_loss_wvc = masked_lm_loss(*wvc, net.MLM_LOSS_NORM_IN_BATCH_FIRST)
            mlm_loss_aux = masked_lm_loss(*aux_part, net.MLM_LOSS_NORM_IN_BATCH_FIRST)
            outputs.update(mlm_logits_wvc=wvc[0], mlm_label_wvc=wvc[1], mlm_logits_aux=aux_part[0],
                           mlm_label_aux=aux_part[1])
        if net.WITH_MVRC_LOSS:
            mvrc_logits = mvrc_logits[:batch]
            mvrc_labels = mvrc_labels[:, :mvrc_logits.shape[1]]
            mvrc = mvrc_loss(mvrc_logits, mvrc_labels, net.MVRC_LOSS_NORM_IN_BATCH_FIRST)
            outputs.update(mvrc_logits=pad_to(mvrc_logits, num_boxes, 1, PAD_LOGIT),
                           mvrc_label=pad_to(mvrc_labels, num_boxes, 1, 0.0))
        outputs.update(relationship_loss=relationship_loss,
                       mlm_loss_wvc=reported_loss(mlm_loss_wvc, outputs['mlm_label_wvc']),
                       mlm_loss_aux=reported_loss(mlm_loss_aux, outputs['mlm_label_aux']),
                       mvrc_loss=reported_loss(mvrc, outputs['mvrc_label']))
        return outputs, relationship_loss.mean() + mlm_loss_wvc.mean() + mlm_loss_aux.mean() + mvrc.mean()
