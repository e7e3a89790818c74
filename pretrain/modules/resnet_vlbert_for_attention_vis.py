"""VL-BERT with its attention probabilities as output, for attention maps (``pretrain/vis_attention_maps.py``;
the reference release's ``ResNetVLBERTForAttentionVis``)."""
import torch

from common.modeling.visual_linguistic_bert import VisualLinguisticBert
from common.modeling.vlbert_module import collect_obj_reps, valid_text_mask
from .resnet_vlbert_for_pretraining_multitask import ResNetVLBERTForPretrainingMultitask


class ResNetVLBERTForAttentionVis(ResNetVLBERTForPretrainingMultitask):
    """The pretraining model's image encoder and VL-BERT, run once with every layer's attention kept.

    Its parameters are those of ``ResNetVLBERTForPretrainingMultitask`` under the same config (as in the
    reference, so a pretraining checkpoint loads by name); the heads of the ``NETWORK.WITH_*_LOSS`` switches
    (all off in ``cfgs/pretrain/vis_attention_maps_coco.yaml``) are built but not run.

    Batch (``pretrain.data.coco_captions.CaptionAttentionDataset`` ``data_names``): ``image`` [B, 3, H, W] float; ``boxes`` [B, N, 4]
    float pixels of the transformed image (padded rows -1); ``im_info`` [B, 5] float; ``text`` [B, Lt] long
    ``[CLS] caption [SEP]`` word ids (0 = padding). No region is masked; every text token takes the feature
    of region 0 as its visual clue (the whole image with ``DATASET.ADD_IMAGE_AS_A_BOX``), as in pretraining.

    ``forward(*batch) -> outputs`` in both modes (there is no loss):

    - ``attention_probs``: float32 [B, layers, heads, L, L], row q = the softmax of query q over the keys,
      from the eager attention path (``output_attention_probs``: q scaled before the product, so fp16 does
      not overflow), cast to fp32. Token order per sample: its valid text tokens, its valid regions, ``[END]``,
      then padding (L = the batch's longest); padded keys get probability 0.
    - ``hidden_states``: [B, layers, L, H] every layer's output (0 at padded positions).
    """

    def forward(self, image, boxes, im_info, text):
        object_vl, box_mask, obj_reps = self.encode_objects(image, boxes, im_info,
                                                            boxes.new_zeros(boxes.shape[:2], dtype=torch.long))
        # The backbone's own forward: the pretraining heads are not run.
        encoded, _, attention = VisualLinguisticBert.forward(
            self.vlbert, text, torch.zeros_like(text), collect_obj_reps(torch.zeros_like(text), obj_reps),
            valid_text_mask(text), object_vl, box_mask, output_all_encoded_layers=True, output_attention_probs=True)
        return {'attention_probs': torch.stack(attention, 1).float(), 'hidden_states': torch.stack(encoded, 1)}
