"""ViT image encoder for VL-BERT: a timm Vision Transformer, RoI Align on its patch map, VL-BERT's box path.

The ViT (Dosovitskiy et al., ICLR 2021) is timm's (``timm.create_model(NETWORK.IMAGE_VIT_ARCH,
**NETWORK.IMAGE_VIT_ARCH_KWARGS)``), run with ``dynamic_img_size=True``: each image at its own resized size,
its position embeddings interpolated to the image's patch grid (``dynamic_img_pad=True`` pads the right and
bottom edges to whole patches). The patch tokens of the last block (after the final norm) form one feature map
at stride = patch size, and each box's feature is ``roi_align`` (torchvision; He et al., "Mask R-CNN", ICCV
2017) over that one map, averaged over its cells.

One map suffices, as Li et al. show in "Exploring Plain Vision Transformer Backbones for Object Detection"
(ViTDet, ECCV 2022): a plain ViT has no feature hierarchy, and its global self-attention already gives every
token of the last map a receptive field of the whole image. Their ablation of feature pyramids (Sec. 4.1,
Table 1) finds that a simple pyramid built from the last map alone is as good as FPN-style designs that read
several backbone levels: the last map holds what the boxes need. Their remaining gain from any pyramid is in
finding small objects; VL-BERT is given its boxes and needs one vector per box, so the boxes are pooled from
the one stride-p map directly, with ViTDet's RoI Align settings (``aligned=True``, adaptive sampling).

Everything after the box features (CNN regularisation loss, IMAGE_SEMANTIC, the masked-RoI swap, the box
geometry embedding and ``obj_downsample``) is :class:`common.modeling.fast_rcnn.RoIEncoder`'s, shared with
:class:`common.modeling.fast_rcnn.FastRCNN`, so the two are drop-ins for each other.
"""
import types
import warnings

import timm
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torchvision.ops import roi_align

from common.runtime import distributed as cdist
from common.errors import UserInputError
from common.modeling.fast_rcnn import RoIEncoder
from common.modeling.module import RandomInitWarning
from common.modeling.timm_weights import arch_kwargs, load_timm_weights

__all__ = ["ViTEncoder", "covers_image", "fp32_attention", "sizes_over_ranks"]

# ViTDet's RoI Align (detectron2 ROIAlignV2): half-pixel offset, sampling points adapted to the box size.
ROI_ALIGNED = True
ROI_SAMPLING_RATIO = 0
WHOLE_IMAGE_TOKENS = ("cls", "mean")


def _fp32_attention_forward(self, x, *args, **kwargs):
    # Bound to an attention module by fp32_attention: its own forward, in fp32 with autocast off.
    with torch.autocast(x.device.type, enabled=False):
        return type(self).forward(self, x.float(), *args, **kwargs).to(x.dtype)


def fp32_attention(module):
    """NETWORK.IMAGE_ATTN_FP32: make ``module`` (a timm attention layer) compute in fp32 inside autocast.

    fp16 attention logits of a ViT overflow and give NaN losses (DeiT, github facebookresearch/deit issues #29
    and #109, fixed by running attention outside autocast). The module's own ``forward`` runs unchanged with its
    input cast to fp32 and autocast disabled; the output comes back in the input's dtype. Only the instance's
    ``forward`` is rebound: its parameters and state-dict keys stay timm's. Returns ``module``.
    """
    module.forward = types.MethodType(_fp32_attention_forward, module)
    return module


def covers_image(coords, image_sizes, patch_size):
    """Whether each box reaches into the first and last patch row and column of its image: the whole-image box.

    Args:
        coords: ``[K, 4]`` clipped ``(x1, y1, x2, y2)`` pixels.
        image_sizes: ``[K, 2]`` ``(w, h)`` of each box's image.
        patch_size: ViT patch side in pixels.
    Returns:
        ``[K]`` bool. The ``DATASET.ADD_IMAGE_AS_A_BOX`` box ``[0, 0, w - 1, h - 1]`` (scaled with the image) is one.
    """
    near = coords.new_tensor(float(patch_size))
    return ((coords[:, 0] < near) & (coords[:, 1] < near) & (coords[:, 2] > image_sizes[:, 0] - 1 - near)
            & (coords[:, 3] > image_sizes[:, 1] - 1 - near))


def _blocks_sharded(vit):
    """Whether FSDP shards ``vit``'s blocks (each is then an ``FSDPModule``)."""
    return len(vit.blocks) > 0 and isinstance(vit.blocks[0], FSDPModule)


def sizes_over_ranks(sizes):
    """The union of every rank's image sizes, sorted: ``sizes`` a list of ``[w, h]`` (this rank's, sorted).

    A collective over the default process group: every rank calls it once per forward, in the same order.
    """
    return [list(s) for s in sorted({tuple(s) for rank_sizes in cdist.all_gather(sizes) for s in rank_sizes})]


class ViTEncoder(RoIEncoder):
    """Box features from a timm ViT's patch map (RoI Align, average over the crop), VL-BERT's box path after.

    Built from ``cfg.NETWORK``: ``IMAGE_VIT_ARCH`` / ``IMAGE_VIT_ARCH_KWARGS`` (a timm ViT by name and keyword
    arguments; ``num_classes=0``, ``dynamic_img_size=True``, ``dynamic_img_pad=True`` are ours),
    ``IMAGE_ROI_POOLED_SIZE`` (RoI Align crop side, cells), ``IMAGE_VIT_WHOLE_IMAGE``, ``IMAGE_VIT_FROZEN_BLOCKS``
    (-1: nothing frozen; 0: patch embedding, position embedding and prefix tokens; N: those and blocks 0..N-1),
    ``IMAGE_ATTN_FP32`` (:func:`fp32_attention` on every block), ``GRADIENT_CHECKPOINTING`` (timm's
    ``set_grad_checkpointing``: blocks recomputed in the backward), ``IMAGE_SEMANTIC``, ``IMAGE_PRETRAINED`` (a
    timm ``.safetensors`` / ``.pth`` file, loaded by :meth:`init_weight`).

    Whole-image token: a box that reaches into the first and last patch row and column of its image
    (:func:`covers_image`; the ``DATASET.ADD_IMAGE_AS_A_BOX`` box 0, which the text tokens without an object
    read in VL-BERT) takes the image's global token instead of its RoI Align average: the CLS token
    (``IMAGE_VIT_WHOLE_IMAGE: cls``, the token a timm ViT is pretrained to summarise the image with) or the mean
    of the image's patch tokens (``mean``; for ViTs without a class token). Without ADD_IMAGE_AS_A_BOX no box is
    usually that large, and the global token is not used.

    Args:
        cfg, average_pool, final_dim, enable_cnn_reg_loss: as :class:`common.modeling.fast_rcnn.FastRCNN`.

    Raises:
        UserInputError: ``IMAGE_VIT_ARCH`` is not a timm ViT (no ``patch_embed`` / ``blocks``), its patches are
            not square, ``IMAGE_VIT_WHOLE_IMAGE: cls`` for a ViT without a class token, or more frozen blocks
            than the ViT has.
        RuntimeError: timm does not know ``IMAGE_VIT_ARCH``.
        ValueError: ``average_pool=False``, ``IMAGE_FEAT_PRECOMPUTED`` (the ViT computes the features).

    Submodules: ``vit`` (the timm model, timm's state-dict names), ``obj_downsample``, ``object_embed``
    (IMAGE_SEMANTIC), ``regularizing_predictor`` (enable_cnn_reg_loss), as FastRCNN's.
    """

    def __init__(self, cfg, average_pool=True, final_dim=768, enable_cnn_reg_loss=False):
        super().__init__()
        net = cfg.NETWORK
        if not average_pool:
            raise ValueError("ViTEncoder(average_pool=False) is not supported: obj_downsample needs one vector per box")
        if net.IMAGE_FEAT_PRECOMPUTED:
            raise ValueError("NETWORK.IMAGE_FEAT_PRECOMPUTED: precomputed box features replace the image encoder; "
                             "use NETWORK.IMAGE_ENCODER 'resnet' with them")
        self.arch = net.IMAGE_VIT_ARCH
        self.pretrained_path = net.IMAGE_PRETRAINED or None
        self.roi_size = net.IMAGE_ROI_POOLED_SIZE
        self.whole_image = net.IMAGE_VIT_WHOLE_IMAGE
        kwargs = arch_kwargs(net.IMAGE_VIT_ARCH_KWARGS, "NETWORK.IMAGE_VIT_ARCH_KWARGS")
        kwargs.update(num_classes=0, dynamic_img_size=True, dynamic_img_pad=True)
        self.vit = timm.create_model(self.arch, pretrained=False, **kwargs)
        if not all(hasattr(self.vit, name) for name in ("patch_embed", "blocks", "num_prefix_tokens")):
            raise UserInputError("NETWORK.IMAGE_VIT_ARCH = {}: expected a timm Vision Transformer (patch_embed, "
                                 "blocks, prefix tokens), got {}".format(self.arch, type(self.vit).__name__))
        patch = tuple(self.vit.patch_embed.patch_size)
        if patch[0] != patch[1]:
            raise UserInputError("NETWORK.IMAGE_VIT_ARCH(_KWARGS): the RoI Align map needs square patches, got "
                                 "{}".format(patch))
        self.patch_size = patch[0]
        if self.whole_image == "cls" and getattr(self.vit, "cls_token", None) is None:
            raise UserInputError("NETWORK.IMAGE_VIT_WHOLE_IMAGE = 'cls': {} has no class token; use 'mean'".format(
                self.arch))
        self._freeze(net.IMAGE_VIT_FROZEN_BLOCKS)
        if net.IMAGE_ATTN_FP32:
            for block in self.vit.blocks:
                fp32_attention(block.attn)
        if net.GRADIENT_CHECKPOINTING:
            self.vit.set_grad_checkpointing(True)
        self._init_box_head(net, self.vit.embed_dim, final_dim, enable_cnn_reg_loss)

    def _freeze(self, frozen_blocks):
        """IMAGE_VIT_FROZEN_BLOCKS: no gradient for the embeddings (>= 0) and the first ``frozen_blocks`` blocks."""
        if frozen_blocks < 0:
            return
        if frozen_blocks > len(self.vit.blocks):
            raise UserInputError("NETWORK.IMAGE_VIT_FROZEN_BLOCKS = {}: {} has {} blocks".format(
                frozen_blocks, self.arch, len(self.vit.blocks)))
        embeddings = [self.vit.patch_embed] + [getattr(self.vit, name) for name in
                                               ("cls_token", "reg_token", "pos_embed", "norm_pre")]
        for part in embeddings + list(self.vit.blocks[:frozen_blocks]):
            if part is not None:  # a ViT without class / register tokens or position embedding
                part.requires_grad_(False)

    def init_weight(self):
        """Load ``IMAGE_PRETRAINED`` (timm weights of ``IMAGE_VIT_ARCH``; the file's classifier is dropped) into
        ``vit``, or warn (:class:`RandomInitWarning`) that it stays random.

        Raises:
            FileNotFoundError, common.fileio.safe_load.UnreadableFileError: see
                :func:`common.modeling.timm_weights.load_timm_weights`.
            common.modeling.timm_weights.TimmWeightsError: the file holds another architecture (a
                ``UserInputError`` naming ``IMAGE_VIT_ARCH``, the one expected).
        """
        if self.pretrained_path is None:
            warnings.warn(RandomInitWarning("NETWORK.IMAGE_PRETRAINED is empty: the ViT image encoder {} keeps its "
                                            "random initialisation".format(self.arch), self.vit), stacklevel=2)
            return
        load_timm_weights(self.vit, self.pretrained_path, self.arch)

    def _box_features(self, images, im_info, coords, batch_idx, box_idx, segms):
        """``[K, embed_dim]`` features of the valid boxes (see :meth:`RoIEncoder._box_features`).

        Images of one size run through the ViT together, each cropped to its own size (``im_info``): a padded
        canvas would change every token through attention and the interpolated position embeddings. The
        loop is over the distinct image sizes of the batch, not over boxes. With the ViT's blocks sharded by
        FSDP (:func:`common.parallel.fsdp.shard_groups`) each block all-gathers its weights once per run, so
        every rank runs the sizes of every rank's batch (:func:`sizes_over_ranks`, a collective), a size it
        lacks on one black image whose output joins the features as the sum of none of its values, an exact
        zero (so its backward runs too, with zero gradients).
        """
        sizes = im_info[:, :2].round().long()  # (w, h)
        unique, group = torch.unique(sizes, dim=0, return_inverse=True)
        runs = unique.tolist()
        if _blocks_sharded(self.vit):
            runs = sizes_over_ranks(runs)
        group_of_box = group[batch_idx]
        local = torch.empty_like(group)  # position of each image inside its size group
        image_sizes = im_info[batch_idx, :2]
        whole = covers_image(coords, image_sizes, self.patch_size)
        feats, empty_runs = None, None
        for w, h in runs:
            matches = (unique == unique.new_tensor([w, h])).all(1).nonzero(as_tuple=True)[0]
            if not len(matches):  # another rank's size: every block entered as on that rank, on a black image
                fmap, _ = self._feature_map(images.new_zeros(1, images.shape[1], h, w))  # timm refuses 0 images
                nothing = fmap[:0].sum()  # exactly 0, its gradient exactly 0
                empty_runs = nothing if empty_runs is None else empty_runs + nothing
                continue
            g = int(matches[0])
            members = (group == g).nonzero(as_tuple=True)[0]
            local[members] = torch.arange(len(members), device=local.device)
            fmap, token = self._feature_map(images[members, :, :h, :w])
            rows = (group_of_box == g).nonzero(as_tuple=True)[0]
            pooled = self._pool(fmap, local[batch_idx[rows]], coords[rows],
                                None if segms is None else segms[batch_idx[rows], box_idx[rows]])
            pooled = torch.where(whole[rows, None], token[local[batch_idx[rows]]].to(pooled.dtype), pooled)
            if feats is None:
                feats = pooled.new_zeros(len(coords), pooled.shape[-1])
            feats[rows] = pooled
        if feats is None:  # no image in the batch
            feats = coords.new_zeros(0, self.feat_dim)
        if empty_runs is not None:
            feats = feats + empty_runs.to(feats.dtype)  # the sum of no values: 0, adds nothing
        return feats

    def _feature_map(self, images):
        """``images`` ``[G, 3, h, w]`` of one size -> (patch map ``[G, D, ceil(h / p), ceil(w / p)]``, whole-image
        token ``[G, D]``: CLS or patch mean), in the ViT's output dtype (fp32 under autocast: the final norm)."""
        tokens = self.vit.forward_features(images)
        grid_h, grid_w = self.vit.patch_embed.dynamic_feat_size(images.shape[-2:])
        patches = tokens[:, self.vit.num_prefix_tokens:]
        fmap = patches.transpose(1, 2).reshape(len(images), -1, grid_h, grid_w)
        token = tokens[:, 0] if self.whole_image == "cls" else patches.mean(1)
        return fmap, token

    def _pool(self, fmap, image_idx, coords, segms):
        """Average of the ``IMAGE_ROI_POOLED_SIZE``-square RoI Align crop of each box: ``[k, D]``.

        ``image_idx`` ``[k]`` indexes ``fmap``'s images, ``coords`` ``[k, 4]`` pixels; ``segms`` ``[k, m, m]`` or
        None multiplies each crop before the average (resized to the crop when ``m`` differs)."""
        rois = torch.cat((image_idx[:, None].to(coords.dtype), coords), 1)
        # In float32 whatever the autocast dtype: box coordinates need the precision.
        crops = roi_align(fmap.float(), rois.float(), (self.roi_size, self.roi_size), spatial_scale=1.0 / self.patch_size,
                          sampling_ratio=ROI_SAMPLING_RATIO, aligned=ROI_ALIGNED)
        if segms is not None:
            masks = segms[:, None].float()
            if masks.shape[-1] != self.roi_size or masks.shape[-2] != self.roi_size:
                masks = nn.functional.interpolate(masks, size=(self.roi_size, self.roi_size), mode="bilinear",
                                                  align_corners=False)
            crops = crops * masks
        return crops.mean((2, 3)).to(fmap.dtype)
