"""NETWORK.IMAGE_ENCODER: the one place that picks VL-BERT's image encoder, names its weights file and checks that
a checkpoint was trained with the same one.

``'resnet'``: :class:`common.modeling.fast_rcnn.FastRCNN` (the paper's Fast R-CNN on a ResNet);
``'vit'``: :class:`common.modeling.vit_encoder.ViTEncoder` (a timm ViT, RoI Align on its patch map). Both take
the same arguments and return the same output dict, so the task modules and ``tools/extract_features.py``
build either through :func:`build_image_encoder`.
"""
import yaml

from common.errors import UserInputError
from common.modeling.fast_rcnn import FastRCNN

__all__ = ["IMAGE_ENCODERS", "build_image_encoder", "image_weights_input", "checkpoint_image_encoder",
           "check_checkpoint_encoder", "switch_encoder_opts"]

IMAGE_ENCODERS = ("resnet", "vit")
# The ViT encoder's timm model sits under this name in the task models' state dicts.
_VIT_KEY = "image_feature_extractor.vit."


def build_image_encoder(cfg, average_pool=True, final_dim=768, enable_cnn_reg_loss=False):
    """The image encoder ``cfg.NETWORK.IMAGE_ENCODER`` names, built with FastRCNN's arguments.

    Args:
        cfg: the task config (``NETWORK`` keys of :func:`common.modeling.vlbert_config.add_vlbert_config`).
        average_pool, final_dim, enable_cnn_reg_loss: see :class:`common.modeling.fast_rcnn.FastRCNN`.
    Returns:
        ``FastRCNN`` or ``ViTEncoder``: ``forward(images, boxes, box_mask, im_info, classes=None, segms=None,
        mvrc_ops=None, mask_visual_embed=None) -> {'obj_reps_raw' [B, N, feat_dim], 'obj_reps' [B, N, final_dim],
        ...}``, ``init_weight()``, ``feat_dim``.
    Raises:
        UserInputError: an unknown encoder name; the encoders' own errors.
    """
    name = cfg.NETWORK.IMAGE_ENCODER
    if name == "resnet":
        return FastRCNN(cfg, average_pool=average_pool, final_dim=final_dim, enable_cnn_reg_loss=enable_cnn_reg_loss)
    if name == "vit":
        from common.modeling.vit_encoder import ViTEncoder  # timm is imported only for a ViT
        return ViTEncoder(cfg, average_pool=average_pool, final_dim=final_dim, enable_cnn_reg_loss=enable_cnn_reg_loss)
    raise UserInputError("NETWORK.IMAGE_ENCODER: expected one of {}, got {!r}".format(", ".join(IMAGE_ENCODERS), name))


def switch_encoder_opts(defaults, encoder):
    """``--opts`` pairs that make a config build ``encoder``: NETWORK.IMAGE_ENCODER, and the keys only the other
    encoder reads back at their ``defaults`` (a task's defaults CfgNode; they are refused otherwise). The new
    encoder's own keys keep their values (their defaults unless the config or later ``--opts`` set them)."""
    from common.modeling.vlbert_config import RESNET_ONLY_KEYS, VIT_ONLY_KEYS

    if encoder not in IMAGE_ENCODERS:
        raise UserInputError("image encoder: expected one of {}, got {!r}".format(", ".join(IMAGE_ENCODERS), encoder))
    opts = ["NETWORK.IMAGE_ENCODER", encoder]
    for key in VIT_ONLY_KEYS if encoder == "resnet" else RESNET_ONLY_KEYS:
        value = defaults.NETWORK[key.split(".")[-1]]
        opts += [key, value if isinstance(value, str) else repr(value)]
    return opts


def image_weights_input(net):
    """``(what, path)`` of the image encoder weights file the ``NETWORK`` node names, or None (none, or the boxes
    carry precomputed features): the ResNet's ``{IMAGE_PRETRAINED}-{IMAGE_PRETRAINED_EPOCH:04d}.model``, the
    ViT's ``IMAGE_PRETRAINED`` file itself."""
    if not net.IMAGE_PRETRAINED or net.IMAGE_FEAT_PRECOMPUTED:
        return None
    if net.IMAGE_ENCODER == "vit":
        return "timm ViT weights", net.IMAGE_PRETRAINED
    return "ResNet weights", "{}-{:04d}.model".format(net.IMAGE_PRETRAINED, net.IMAGE_PRETRAINED_EPOCH)


def checkpoint_image_encoder(ckpt):
    """The image encoder a checkpoint dict was trained with.

    Our checkpoints save the run's config (``config``, YAML text); its ``NETWORK.IMAGE_ENCODER`` is the record
    ('resnet' when the config predates the key). A file without a config (the reference release's, a
    pretraining file from elsewhere) is read by its keys: the ViT's under ``image_feature_extractor.vit.``.

    Returns:
        'resnet' or 'vit'.
    """
    text = ckpt.get("config")
    if isinstance(text, str):
        try:
            saved = yaml.safe_load(text)
        except yaml.YAMLError:
            saved = None
        if isinstance(saved, dict) and isinstance(saved.get("NETWORK"), dict):
            return saved["NETWORK"].get("IMAGE_ENCODER", "resnet")
    keys = ckpt.get("state_dict", {})
    return "vit" if any(k.split("module.", 1)[-1].startswith(_VIT_KEY) for k in keys) else "resnet"


def check_checkpoint_encoder(cfg, ckpt, source):
    """Stop when the checkpoint ``ckpt`` (read from ``source``) was trained with another image encoder than the
    config's (resume, NETWORK.PARTIAL_PRETRAIN, evaluation).

    Raises:
        UserInputError: names both encoders and the file.
    """
    ours, theirs = cfg.NETWORK.IMAGE_ENCODER, checkpoint_image_encoder(ckpt)
    if ours != theirs:
        raise UserInputError(
            "{} was trained with the image encoder NETWORK.IMAGE_ENCODER '{}', but this config builds '{}': its "
            "image weights cannot load. Set NETWORK.IMAGE_ENCODER '{}' or use a checkpoint of a '{}' run".format(
                source, theirs, ours, theirs, ours))
