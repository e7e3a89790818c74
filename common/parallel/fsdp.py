"""Fully sharded data parallel training (PyTorch's FSDP2, ``torch.distributed.fsdp.fully_shard``).

Each rank keeps a 1/N shard of every parameter, of its gradient and of the optimizer state; a shard group's
full parameters are all-gathered just before its forward (and again before its backward) and freed after, its
gradients reduce-scattered after its backward. The groups, innermost first:

- every VL-BERT encoder layer (``common.modeling.nlp.modeling.BertLayer``);
- every block of a timm vision transformer (``<vit>.blocks[i]``: the ViT image encoder of VL-BERT and the cls
  task's classifier);
- the image backbone: the timm ViT itself (patch embedding, tokens, final norm) or the ResNet trunk of the
  Fast R-CNN encoder (``common.modeling.backbone.resnet.ResNetC4``);
- the root: everything else (embeddings, pooler, heads; tied weights such as the MLM decoder and the word
  embeddings stay together in this group).
"""
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

from common.modeling.backbone.resnet import ResNetC4
from common.modeling.nlp.modeling import BertLayer


def _is_timm_vit(module):
    """A timm vision transformer: a patch embedding and a sequence of blocks."""
    return hasattr(module, "patch_embed") and isinstance(getattr(module, "blocks", None), (nn.Sequential, nn.ModuleList))


def shard_groups(model):
    """The modules :func:`shard_model` wraps, innermost first (the root last).

    Returns:
        list of (qualified name, module); the root's name is ``''``.
    """
    blocks, backbones = [], []
    for name, module in model.named_modules():
        if isinstance(module, BertLayer):
            blocks.append((name, module))
        elif _is_timm_vit(module):
            blocks += [("{}.blocks.{}".format(name, i) if name else "blocks.{}".format(i), block)
                       for i, block in enumerate(module.blocks)]
            backbones.append((name, module))
        elif isinstance(module, ResNetC4):
            backbones.append((name, module))
    return blocks + [(n, m) for n, m in backbones if n] + [("", model)]


def shard_model(model, mesh=None, mp_policy=None):
    """Shard ``model`` in place with ``fully_shard`` on each group of :func:`shard_groups`.

    Parameters become ``torch.distributed.tensor.DTensor`` shards (dim 0 split over the mesh); buffers (e.g.
    frozen batch-norm statistics) stay whole on every rank. A timm ViT whose ``forward_features`` is called
    directly (the VL-BERT image encoder) gets that method registered so its group gathers its parameters there too.

    Args:
        model: the task model, on its device, parameters fp32.
        mesh: 1-D ``DeviceMesh`` to shard over; None: the default process group.
        mp_policy: ``torch.distributed.fsdp.MixedPrecisionPolicy`` or None (compute in the parameters' dtype).
    Returns:
        ``model`` (the same object, now an ``FSDPModule`` subclass).
    Raises:
        RuntimeError: no default process group (``torch.distributed`` not initialized) and no ``mesh``.
    """
    kwargs = {"mesh": mesh}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    for name, module in shard_groups(model):
        fully_shard(module, **kwargs)
        if name and _is_timm_vit(module):
            register_fsdp_forward_method(module, "forward_features")
    return model


def is_sharded(model):
    """Whether ``model`` was sharded by :func:`shard_model` (its parameters are DTensor shards)."""
    return isinstance(model, torch.distributed.fsdp.FSDPModule)
