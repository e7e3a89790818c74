"""Fast R-CNN image encoder: one feature vector per box for the visual-linguistic BERT.

Fast R-CNN with a ResNet C4 backbone (Girshick, ICCV 2015; He et al., CVPR 2016): res2..res4 run
on the whole image, ``roi_align`` (He et al., "Mask R-CNN", ICCV 2017) crops 14x14 cells
(``NETWORK.IMAGE_ROI_POOLED_SIZE``) at stride 16 per box, res5 and an average pool turn each crop into a vector. VL-BERT (Su et al., ICLR
2020, Sec. 3.2) then concatenates a sinusoidal embedding of the box geometry and projects to the
BERT width. Parameter names, the RoI Align settings and the box embedding follow the reference
release (github jackroos/VL-BERT, ``common/fast_rcnn.py``) so its checkpoints load strictly.
"""
import os
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import roi_align

from common.fileio.safe_load import load_tensors
from common.modeling.backbone import build_resnet, freeze_stages, load_resnet_weights, resnet_channels
from common.modeling.module import RandomInitWarning

__all__ = ["FastRCNN", "RoIEncoder", "coordinate_embeddings", "clip_boxes"]

# Reference settings: RoI Align on C4 (stride 16), one sample per bin, no half-pixel offset (the
# maskrcnn-benchmark kernel the reference compiled); the crop side is NETWORK.IMAGE_ROI_POOLED_SIZE (14).
ROI_SPATIAL_SCALE = 1.0 / 16
ROI_SAMPLING_RATIO = 1
# Width of the sin / cos box embedding per coordinate and sign (4 coords x 2 x 256 = 2048 dims).
COORD_EMBED_DIM = 256
# Bottom-up-attention features stored with precomputed boxes (IMAGE_FEAT_PRECOMPUTED).
PRECOMPUTED_FEAT_DIM = 2048
# Object classes (80 COCO classes + background) and width of their embedding (IMAGE_SEMANTIC).
NUM_OBJECT_CLASSES = 81
OBJECT_EMBED_DIM = 128


def clip_boxes(boxes, image_sizes):
    """Clip ``[K, 4]`` boxes ``(x1, y1, x2, y2)`` in pixels to ``[0, w - 1] x [0, h - 1]``.

    ``image_sizes``: ``[K, 2]`` ``(w, h)`` of each box's own image (not the padded batch), the
    same range the reference datasets clamp to. Returns a new tensor of ``boxes``' dtype.
    """
    limits = (image_sizes - 1).to(boxes.dtype).repeat(1, 2)
    return torch.minimum(boxes.clamp(min=0), limits)


def coordinate_embeddings(boxes, image_sizes, dim=COORD_EMBED_DIM):
    """Sinusoidal embedding of box geometry, as VL-BERT's reference release computes it.

    Each box becomes ``(x_center, y_center, width, height)`` in percent of its image size; each of
    the 4 numbers ``p`` gives ``[sin(p / 1000^(i / dim)) for i < dim]`` followed by the matching
    cosines (the Transformer position encoding of Vaswani et al., 2017, with base 1000).

    Args:
        boxes: ``[K, 4]`` ``(x1, y1, x2, y2)`` in pixels.
        image_sizes: ``[K, 2]`` ``(w, h)`` in pixels of each box's image.
        dim: frequencies per coordinate.

    Returns:
        ``[K, 4 * 2 * dim]`` float32, laid out ``[x_c sin, x_c cos, y_c sin, ..., h cos]``.
    """
    boxes = boxes.float()
    image_sizes = image_sizes.float()
    center = (boxes[:, :2] + boxes[:, 2:]) / 2
    size = boxes[:, 2:] - boxes[:, :2]
    pos = torch.cat((center, size), 1) / image_sizes.repeat(1, 2) * 100
    inv_freq = 1000 ** (-torch.arange(dim, dtype=torch.float32, device=boxes.device) / dim)
    angles = pos[:, :, None] * inv_freq
    return torch.cat((angles.sin(), angles.cos()), -1).flatten(1)


class RoIEncoder(nn.Module):
    """What every VL-BERT image encoder shares after its box features: the forward contract of the task
    modules (arguments and output dict), the CNN regularisation classifier, the class embedding
    (IMAGE_SEMANTIC), the masked-RoI swap of pretraining and the box-geometry embedding + ``obj_downsample``
    projection of VL-BERT (Su et al., ICLR 2020, Sec. 3.2).

    A subclass builds its image part, calls :meth:`_init_box_head` with the width of its box features, and
    implements :meth:`_box_features`. Attributes: ``image_feat_precomputed`` (boxes carry their features),
    ``feat_dim`` (width of ``obj_reps_raw``), ``enable_cnn_reg_loss``.
    """

    image_feat_precomputed = False

    def _init_box_head(self, net, feat_dim, final_dim, enable_cnn_reg_loss):
        """``regularizing_predictor`` (when ``enable_cnn_reg_loss``), ``object_embed`` (``net.IMAGE_SEMANTIC``) and
        ``obj_downsample`` for box features of width ``feat_dim``, in the reference's state-dict order."""
        self.feat_dim = feat_dim
        self.enable_cnn_reg_loss = enable_cnn_reg_loss
        if enable_cnn_reg_loss:
            self.regularizing_predictor = nn.Linear(feat_dim, NUM_OBJECT_CLASSES)
        self.object_embed = nn.Embedding(NUM_OBJECT_CLASSES, OBJECT_EMBED_DIM) if net.IMAGE_SEMANTIC else None
        in_dim = 8 * COORD_EMBED_DIM + feat_dim + (OBJECT_EMBED_DIM if net.IMAGE_SEMANTIC else 0)
        self.obj_downsample = nn.Sequential(nn.Dropout(p=0.1), nn.Linear(in_dim, final_dim), nn.ReLU(inplace=True))

    def forward(self, images, boxes, box_mask, im_info, classes=None, segms=None, mvrc_ops=None,
                mask_visual_embed=None):
        """Encode the valid boxes of each image; padded slots come back as zeros.

        Args:
            images: ``[B, 3, H, W]`` normalised images, zero-padded to the batch's largest size
                (unused with precomputed features).
            boxes: ``[B, N, 4]`` ``(x1, y1, x2, y2)`` pixels of the resized image, or
                ``[B, N, 4 + 2048]`` with the box features appended (IMAGE_FEAT_PRECOMPUTED).
                Boxes are clipped to their own image; degenerate (e.g. all-zero) boxes are valid.
            box_mask: ``[B, N]`` bool (or 0/1), True for real boxes.
            im_info: ``[B, >=2]``, columns 0 and 1 are each image's width and height in pixels.
            classes: ``[B, N]`` object class ids in ``[0, 81)``; needed for IMAGE_SEMANTIC and the
                CNN regularisation loss.
            segms: ``[B, N, h, w]`` masks multiplied into the box's feature map before pooling (FastRCNN:
                res5's output, h = w = IMAGE_ROI_POOLED_SIZE (14) when IMAGE_C5_DILATED, else half of it
                rounded up; the ViT encoder: its RoI Align crop).
            mvrc_ops: ``[B, N]``, 1 where the box's visual feature is replaced by
                ``mask_visual_embed`` (``[D]``, D = pooled feature width (+128 with IMAGE_SEMANTIC))
                before the projection (masked RoI modelling in pretraining).

        Returns:
            dict with ``obj_reps_raw`` ``[B, N, C]`` (pooled box features, C = ``feat_dim``: 2048 for ResNet-50+
            and precomputed features, 512 for ResNet-18/34, the embedding width of a ViT) and
            ``obj_reps`` ``[B, N, final_dim]`` (after ``obj_downsample``), zero where ``box_mask``
            is False; with the CNN regularisation loss also ``obj_logits`` ``[K, 81]``,
            ``obj_labels`` ``[K]`` (K = number of valid boxes, row-major) and
            ``cnn_regularization_loss`` ``[1]`` (mean cross-entropy).
        """
        box_mask = box_mask.bool()
        batch_idx, box_idx = box_mask.nonzero(as_tuple=True)
        image_sizes = im_info[batch_idx, :2]
        coords = clip_boxes(boxes[batch_idx, box_idx, :4], image_sizes)
        labels = classes[batch_idx, box_idx].long() if classes is not None else None
        if (self.object_embed is not None or self.enable_cnn_reg_loss) and labels is None:
            raise ValueError(f"{type(self).__name__}: IMAGE_SEMANTIC and the CNN regularisation loss need `classes`")

        if self.image_feat_precomputed:
            feats = boxes[batch_idx, box_idx, 4:]
            if feats.shape[-1] != self.feat_dim:
                raise ValueError(f"{type(self).__name__} (IMAGE_FEAT_PRECOMPUTED): boxes must be [B, N, 4 + {self.feat_dim}], "
                                 f"got {tuple(boxes.shape)}")
        else:
            feats = self._box_features(images, im_info, coords, batch_idx, box_idx, segms)

        outputs = {}
        if self.enable_cnn_reg_loss:
            logits = self.regularizing_predictor(feats)
            # Sum / count rather than the mean so that a batch without boxes gives 0, not NaN.
            loss = F.cross_entropy(logits.float(), labels, reduction="sum") / max(len(labels), 1)
            outputs.update(obj_logits=logits, obj_labels=labels, cnn_regularization_loss=loss[None])

        visual = feats
        if self.object_embed is not None:
            visual = torch.cat((feats, self.object_embed(labels).to(feats.dtype)), -1)
        if mvrc_ops is not None and mask_visual_embed is not None:
            masked = (mvrc_ops[batch_idx, box_idx] == 1)[:, None]
            visual = torch.where(masked, mask_visual_embed.to(visual.dtype), visual)
        coord_embed = coordinate_embeddings(coords, image_sizes).to(visual.dtype)
        obj_reps = self.obj_downsample(torch.cat((coord_embed, visual), -1))

        outputs["obj_reps_raw"] = self._scatter(feats, box_mask)
        outputs["obj_reps"] = self._scatter(obj_reps, box_mask)
        return outputs

    def _box_features(self, images, im_info, coords, batch_idx, box_idx, segms):
        """``[K, feat_dim]`` features of the valid boxes: ``coords`` ``[K, 4]`` clipped pixels of image
        ``batch_idx`` ``[K]`` (slot ``box_idx`` ``[K]``); ``images``, ``im_info`` and ``segms`` as in :meth:`forward`."""
        raise NotImplementedError

    @staticmethod
    def _scatter(values, box_mask):
        """``[K, D]`` rows of the valid boxes -> ``[B, N, D]`` with zeros in padded slots."""
        out = values.new_zeros(*box_mask.shape, values.shape[-1])
        out[box_mask] = values
        return out


class FastRCNN(RoIEncoder):
    """Box features from images (ResNet C4 + RoI Align + res5) or from precomputed features.

    Built from ``cfg.NETWORK``: ``IMAGE_NUM_LAYERS`` (18/34/50/101/152), ``IMAGE_STRIDE_IN_1x1``,
    ``IMAGE_C5_DILATED``, ``IMAGE_FROZEN_BN``, ``IMAGE_FROZEN_BACKBONE_STAGES`` (1 = stem, 2..4 =
    res2..res4, 5 = res5 head), ``IMAGE_FEAT_PRECOMPUTED``, ``IMAGE_SEMANTIC`` (add a learned
    embedding of the box's class), ``IMAGE_PRETRAINED`` / ``IMAGE_PRETRAINED_EPOCH`` (weights
    file ``{path}-{epoch:04d}.model``, loaded by :meth:`init_weight`).

    Args:
        cfg: the task config (yacs CfgNode or anything with the same attributes).
        average_pool: must be True (kept for the reference's call signature; the projection
            needs one vector per box).
        final_dim: width of ``obj_reps`` (the task modules pass ``NETWORK.IMAGE_FINAL_DIM``).
        enable_cnn_reg_loss: add a linear box classifier on the pooled features and return its
            cross-entropy loss (needs ``classes``; ignored with precomputed features).

    Raises:
        ValueError: bad ``IMAGE_NUM_LAYERS`` / frozen stage, or ``average_pool=False``.
        NotImplementedError: ``OUTPUT_CONV5: true`` (the reference release never built the head
            that key needs).
        FileNotFoundError: ``IMAGE_PRETRAINED`` is set but ``{path}-{epoch:04d}.model`` is absent.

    Submodules (state-dict names of the reference): ``backbone`` (stem + res2..res4),
    ``roi_head_feature_extractor`` (res5), ``head`` (res5, pool, flatten; shares res5),
    ``obj_downsample`` (dropout 0.1, linear, ReLU), ``object_embed`` (IMAGE_SEMANTIC),
    ``regularizing_predictor`` (enable_cnn_reg_loss).
    """

    def __init__(self, cfg, average_pool=True, final_dim=768, enable_cnn_reg_loss=False):
        super().__init__()
        net = cfg.NETWORK
        if not average_pool:
            raise ValueError("FastRCNN(average_pool=False) is not supported: obj_downsample needs one vector per box")
        if net.OUTPUT_CONV5:
            raise NotImplementedError("NETWORK.OUTPUT_CONV5: true is not supported (the reference release "
                                      "never defined the image head it needs); set it to false")
        self.image_feat_precomputed = net.IMAGE_FEAT_PRECOMPUTED
        self.pretrained_path = None
        self.roi_size = net.IMAGE_ROI_POOLED_SIZE
        if self.roi_size < 1:
            raise ValueError(f"NETWORK.IMAGE_ROI_POOLED_SIZE must be >= 1, got {self.roi_size}")

        if self.image_feat_precomputed:
            feat_dim = PRECOMPUTED_FEAT_DIM
        else:
            _, feat_dim = resnet_channels(net.IMAGE_NUM_LAYERS)
            if net.IMAGE_PRETRAINED:
                self.pretrained_path = f"{net.IMAGE_PRETRAINED}-{net.IMAGE_PRETRAINED_EPOCH:04d}.model"
                if not os.path.isfile(self.pretrained_path):
                    raise FileNotFoundError(f"NETWORK.IMAGE_PRETRAINED / IMAGE_PRETRAINED_EPOCH: weights file "
                                            f"{self.pretrained_path} does not exist")
            trunk, res5 = build_resnet(net.IMAGE_NUM_LAYERS, stride_in_1x1=net.IMAGE_STRIDE_IN_1x1,
                                       c5_dilated=net.IMAGE_C5_DILATED, frozen_bn=net.IMAGE_FROZEN_BN)
            freeze_stages(trunk, res5, net.IMAGE_FROZEN_BACKBONE_STAGES)
            self.backbone = trunk
            self.roi_head_feature_extractor = res5
            self.head = nn.Sequential(res5, nn.AdaptiveAvgPool2d(1), nn.Flatten(1))
        self._init_box_head(net, feat_dim, final_dim, enable_cnn_reg_loss and not self.image_feat_precomputed)

    def init_weight(self):
        """Load ``IMAGE_PRETRAINED`` into the ResNet, or warn (:class:`RandomInitWarning`) that it stays
        randomly initialised; the engine holds that warning back when a checkpoint fills the ResNet.

        The file holds a whole-ResNet state dict (``conv1``.. ``layer4``; ``layer4`` goes to res5),
        as the reference's ``resnet101-pt-vgbua-0000.model``. The task model calls this once after
        construction, like the reference's ``init_weight``. No-op with precomputed features.

        Raises:
            common.fileio.safe_load.UnreadableFileError: unreadable, or asks to run code (refused, not run).
            ValueError: the file lacks weights of this ResNet (message names the file and keys).
            RuntimeError: a tensor shape differs (wrong ``IMAGE_NUM_LAYERS``).
        """
        if self.image_feat_precomputed:
            return
        if self.pretrained_path is None:
            warnings.warn(RandomInitWarning("NETWORK.IMAGE_PRETRAINED is empty: the ResNet image backbone keeps "
                                            "its random initialisation", self.backbone), stacklevel=2)
            return
        state_dict = load_tensors(self.pretrained_path, "NETWORK.IMAGE_PRETRAINED weights")
        if not isinstance(state_dict, dict):
            raise ValueError(f"{self.pretrained_path}: expected a ResNet state dict (name -> tensor), "
                             f"got {type(state_dict).__name__}")
        load_resnet_weights(self.backbone, self.roi_head_feature_extractor, state_dict, self.pretrained_path)

    def _box_features(self, images, im_info, coords, batch_idx, box_idx, segms):
        """``[K, C5]`` pooled res5 features of the (clipped) boxes ``coords`` ``[K, 4]``."""
        c4 = self.backbone(images)
        rois = torch.cat((batch_idx[:, None].to(coords.dtype), coords), 1)
        # RoI Align in float32 whatever the autocast / model dtype: box coordinates need the precision.
        crops = roi_align(c4.float(), rois.float(), (self.roi_size, self.roi_size), spatial_scale=ROI_SPATIAL_SCALE,
                          sampling_ratio=ROI_SAMPLING_RATIO, aligned=False).to(c4.dtype)
        x = self.roi_head_feature_extractor(crops)
        if segms is not None:
            x = x * segms[batch_idx, box_idx][:, None].to(x.dtype)
        return self.head[1:](x)
