"""The attention probabilities of a VL-BERT forward, recorded from outside the model: any task's model (VQA,
VCR, RefCOCO+, pretraining) answers as usual and its VL-BERT's attention is kept on the side.

    with record_attention(model) as records:
        outputs = model(*batch)
    records[0].item(0)   # {"probs": [layers, heads, T, T], "text_ids": [Lt], "num_regions": R}

Hooks, no model change: the VL-BERT's encoder is asked for its probabilities (the eager attention path of
``BertSelfAttention``, as ``pretrain/vis_attention_maps.py`` uses; it equals the fused path to float rounding)
and gives the model the outputs it asked for.
"""
import contextlib
import inspect

import torch

from common.modeling.visual_linguistic_bert import VisualLinguisticBert

__all__ = ["AttentionRecord", "record_attention"]


class AttentionRecord:
    """One VL-BERT forward's attention and the layout of its packed sequence.

    Each sample's sequence is its valid text tokens, its valid regions, ``[END]``, then padding (the
    VL-BERT's embedding order).

    Attributes:
        probs: float32 ``[B, layers, heads, L, L]`` (CPU); row q is token q's attention over the keys.
        text_ids: long ``[B, Lt]`` word ids given to the VL-BERT. text_mask: bool ``[B, Lt]`` valid text.
        object_mask: bool ``[B, No]`` valid regions.
    """

    def __init__(self, probs, text_ids, text_mask, object_mask):
        self.probs, self.text_ids, self.text_mask, self.object_mask = probs, text_ids, text_mask, object_mask

    def item(self, b):
        """Sample ``b``: ``{"probs": float32 [layers, heads, T, T], "text_ids": [Lt_b] list, "num_regions": R}``,
        cut to its own T = Lt_b + R + 1 tokens (text, regions, ``[END]``)."""
        text_ids = self.text_ids[b][self.text_mask[b]].tolist()
        regions = int(self.object_mask[b].sum())
        t = len(text_ids) + regions + 1
        return {"probs": self.probs[b, :, :, :t, :t].numpy(), "text_ids": text_ids, "num_regions": regions}


@contextlib.contextmanager
def record_attention(model):
    """Record the attention of every VL-BERT forward of ``model`` while the block runs.

    Args:
        model: a module holding a :class:`common.modeling.visual_linguistic_bert.VisualLinguisticBert`.
    Yields:
        list that gets one :class:`AttentionRecord` per VL-BERT forward, in call order.
    Raises:
        ValueError: ``model`` holds no VL-BERT (a ViT classifier has no text to attend from).
    """
    vlberts = [m for m in model.modules() if isinstance(m, VisualLinguisticBert)]
    if not vlberts:
        raise ValueError("{} has no VL-BERT: no attention over regions to record".format(type(model).__name__))
    signature = inspect.signature(VisualLinguisticBert.forward)
    encoder_signature = inspect.signature(type(vlberts[0].encoder).forward)
    records, pending, handles = [], [], []

    def inputs(module, args, kwargs):
        bound = signature.bind(module, *args, **kwargs).arguments
        pending.append([bound["text_input_ids"], bound["text_mask"], bound["object_mask"]])

    def ask_probs(module, args, kwargs):
        bound = encoder_signature.bind(module, *args, **kwargs)
        pending[-1].append(bound.arguments.get("output_attention_probs", False))  # what the model asked for
        bound.arguments["output_attention_probs"] = True
        return bound.args[1:], bound.kwargs

    def keep_probs(module, args, kwargs, output):
        text_ids, text_mask, object_mask, asked = pending.pop()
        encoded, probs = output
        records.append(AttentionRecord(torch.stack(probs, 1).detach().float().cpu(), text_ids.detach().cpu(),
                                       text_mask.detach().cpu().bool(), object_mask.detach().cpu().bool()))
        return output if asked else encoded

    for vlbert in vlberts:
        handles.append(vlbert.register_forward_pre_hook(inputs, with_kwargs=True))
        handles.append(vlbert.encoder.register_forward_pre_hook(ask_probs, with_kwargs=True))
        handles.append(vlbert.encoder.register_forward_hook(keep_probs, with_kwargs=True))
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()
