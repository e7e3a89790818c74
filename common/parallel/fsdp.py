"""Fully sharded data parallel training (PyTorch's FSDP2, ``torch.distributed.fsdp.fully_shard``).

Each rank keeps a 1/N shard of every parameter, of its gradient and of the optimizer state; a shard group's
full parameters are all-gathered just before its forward (and again before its backward) and freed after, its
gradients reduce-scattered after its backward. The groups, innermost first:

- every VL-BERT encoder layer (``common.modeling.nlp.modeling.BertLayer``);
- every block of a timm vision transformer run through its ``forward`` (``<vit>.blocks[i]``: the cls task's
  classifier);
- every block of the ViT inside VL-BERT's ViT image encoder (``common.modeling.vit_encoder.ViTEncoder``);
- the image backbone: that timm ViT itself (patch embedding, tokens, final norm), the ResNet trunk of the
  Fast R-CNN encoder (``common.modeling.backbone.resnet.ResNetC4``) or VL-BERT's ViT image encoder less its
  blocks (see :func:`shard_groups`);
- the root: everything else (embeddings, pooler, heads; tied weights such as the MLM decoder and the word
  embeddings stay together in this group).

Checkpoints keep the layout of unsharded runs (:mod:`common.checkpoint.checkpointer`): :func:`gather_full` makes full
tensors of
the shards before a save, :func:`shard_like` and :func:`shard_optimizer_state` cut them again on load, so a checkpoint
of either strategy and of any world size resumes under the other.
"""
import collections

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from common.modeling.backbone.resnet import ResNetC4
from common.modeling.nlp.modeling import BertLayer
from common.modeling.vit_encoder import ViTEncoder


def _is_timm_vit(module):
    """A timm vision transformer: a patch embedding and a sequence of blocks."""
    blocks = getattr(module, "blocks", None)
    return hasattr(module, "patch_embed") and isinstance(blocks, (nn.Sequential, nn.ModuleList))


def shard_groups(model):
    """The modules :func:`shard_model` wraps, innermost first (the root last).

    VL-BERT's ViT image encoder runs its ViT through ``forward_features`` (not the ViT's ``forward``, which
    FSDP hooks), once per image size: its blocks are groups, and the encoder itself holds the rest of its ViT
    (patch and position embeddings, final norm) with its box head. Every rank enters each block once per image
    size of any rank's batch (``ViTEncoder._box_features``), so the blocks' collectives pair.

    Returns:
        list of (qualified name, module); the root's name is ``''``.
    """
    blocks, backbones, inside = [], [], []
    for name, module in model.named_modules():
        if any(name == prefix or name.startswith(prefix + ".") for prefix in inside):
            continue  # a ViT whose blocks are taken with its encoder
        if isinstance(module, ViTEncoder):
            blocks += [("{}.vit.blocks.{}".format(name, i), block) for i, block in enumerate(module.vit.blocks)]
            backbones.append((name, module))
            inside.append(name + ".vit")
        elif isinstance(module, BertLayer):
            blocks.append((name, module))
        elif _is_timm_vit(module):
            blocks += [("{}.blocks.{}".format(name, i) if name else "blocks.{}".format(i), block)
                       for i, block in enumerate(module.blocks)]
            backbones.append((name, module))
        elif isinstance(module, ResNetC4):
            backbones.append((name, module))
    return blocks + [(n, m) for n, m in backbones if n] + [("", model)]


def shard_placement(param, ranks):
    """The dimension FSDP2 shards ``param`` on over ``ranks`` ranks: ``Shard(d)``, or None for FSDP2's default,
    dim 0.

    FSDP2 pads dim 0 to a multiple of the ranks, so a parameter with fewer rows than ranks would be whole on every
    rank (rows past the last go to padding): a ViT's position embedding and class token (1 row) cost 1.11 x 1/N of
    ViT-B/16's weights on 64 ranks, BERT's token type embedding (2 rows) is whole from 3 ranks. Such a parameter is
    sharded on its longest dimension that ``ranks`` divides (FSDP2 shards a dimension other than 0 only evenly);
    with none, on dim 0 as any other.

    Args:
        param: the parameter (any device, meta included), before sharding.
        ranks: the size of the mesh it is sharded over.
    Returns:
        ``torch.distributed.tensor.Shard`` or None.
    """
    if param.dim() < 2 or param.shape[0] >= ranks:
        return None
    dims = [d for d in range(1, param.dim()) if param.shape[d] % ranks == 0]
    return Shard(max(dims, key=lambda d: param.shape[d])) if dims else None


def shard_model(model, mesh=None, mp_policy=None):
    """Shard ``model`` in place with ``fully_shard`` on each group of :func:`shard_groups`.

    First every parameter and buffer takes rank 0's value (as DDP does when it wraps a model: ranks seeded
    differently built different random weights). Parameters become ``torch.distributed.tensor.DTensor`` shards
    split over the mesh on dim 0, or on the dimension :func:`shard_placement` gives a parameter with fewer rows
    than ranks; buffers (e.g. frozen batch-norm statistics) stay whole on every rank. A model on the meta device
    is sharded without a broadcast (:mod:`common.parallel.meta_init` fills it after; ``bench/memory_estimate.py``
    only counts its shards).

    Args:
        model: the task model, on its device, parameters fp32.
        mesh: 1-D ``DeviceMesh`` to shard over; None: the default process group.
        mp_policy: ``torch.distributed.fsdp.MixedPrecisionPolicy`` or None (compute in the parameters' dtype).
    Returns:
        ``model`` (the same object, now an ``FSDPModule`` subclass).
    Raises:
        RuntimeError: no default process group (``torch.distributed`` not initialized) and no ``mesh``.
    """
    group = None if mesh is None else mesh.get_group()
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            if not tensor.is_meta:  # a model built on the meta device gets its values later (meta_init.fill)
                torch.distributed.broadcast(tensor, src=torch.distributed.get_global_rank(group, 0) if group else 0,
                                            group=group)
    ranks = mesh.size() if mesh is not None else torch.distributed.get_world_size()
    kwargs = {"mesh": mesh, "shard_placement_fn": lambda param: shard_placement(param, ranks)}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    for _, module in shard_groups(model):
        fully_shard(module, **kwargs)
    return model


def is_sharded(model):
    """Whether ``model`` was sharded by :func:`shard_model` (its parameters are DTensor shards)."""
    return isinstance(model, FSDPModule)


def gather_full(value):
    """``value`` (a tensor, or a nested dict / list / tuple of them, e.g. a state dict) with every DTensor shard
    replaced by the full tensor, on every rank; anything else is returned as is.

    A collective when ``value`` holds DTensors: every rank calls it with the same structure, in the same order.
    """
    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, dict):
        out = {k: gather_full(v) for k, v in value.items()}
        if all(out[k] is v for k, v in value.items()):
            return value  # nothing sharded inside: the object itself (a Counter stays a Counter)
        return collections.OrderedDict(out) if isinstance(value, collections.OrderedDict) else out
    if isinstance(value, (list, tuple)):
        out = [gather_full(v) for v in value]
        return value if all(a is b for a, b in zip(out, value)) else type(value)(out)
    return value


def shard_like(full, target):
    """The full tensor ``full`` laid out as the DTensor ``target`` (same mesh and placements; each rank keeps
    its own shard of the copy it holds, no communication), dtype kept; ``full`` itself when ``target`` is a
    plain tensor. Every rank must hold the same ``full``. A ``full`` that is already a DTensor (read straight into
    shards) is returned as it is."""
    if isinstance(target, DTensor) and not isinstance(full, DTensor):
        return distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
    return full


def shard_optimizer_state(optimizer, state_dict):
    """A full ``optimizer.state_dict()`` (one rank's of an unsharded run, or :func:`gather_full` of a sharded
    one) with each per-parameter tensor (momentum, Adam moments: the parameter's shape) sharded as its
    parameter, ready for ``optimizer.load_state_dict``. Parameters are matched by their position in the
    param groups, as ``torch.optim`` does."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, entry in state_dict["state"].items():
        param = params[index] if isinstance(index, int) and index < len(params) else None
        state[index] = {k: shard_like(v, param) if param is not None and isinstance(v, torch.Tensor)
                        and v.shape == param.shape else v for k, v in entry.items()}
    return dict(state_dict, state=state)
