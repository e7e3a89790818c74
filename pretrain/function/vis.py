"""What ``pretrain/vis_attention_maps.py`` runs: its items (:func:`build_items`) and its model (:func:`build_model`)."""
import torch

from common.checkpoint.partial_pretrain import NOT_BACKBONE_PREFIXES, load_vlbert_backbone
from common.data.box_sources import parse_grid
from common.data.tokenizer import build_tokenizer
from common.data.transforms import build_transforms
from common.errors import UserInputError
from common.modeling.module import held_random_init_warnings
from pretrain.data.coco_captions import CaptionAttentionDataset, attach_boxes, read_caption_list, read_coco_captions
from pretrain.task import TASK

MODULE = "ResNetVLBERTForAttentionVis"


def build_items(cfg, images=None, captions=None, box_source=None, box_file=None, grid="3x3", max_items=0):
    """The :class:`CaptionAttentionDataset` of the attention script's options.

    Args:
        cfg: the attention config; its coco_captions split DATASET.VAL_IMAGE_SET unless ``images``.
        images, captions: a folder of images and its captions JSON (:func:`read_caption_list`), together.
        box_source: one of :data:`BOX_SOURCES`; None: 'coco' for the config's data set, 'grid' for ``images``.
        box_file: the boxes JSON or feature folder of the 'file' / 'features' sources.
        grid: ``'ROWSxCOLS'`` of the 'grid' source. max_items: keep the first ones (0: all).
    Raises:
        UserInputError: ``images`` without ``captions`` or the reverse; a data set other than coco_captions; see
            :func:`read_coco_captions`, :func:`read_caption_list`, :func:`attach_boxes`.
    """
    d = cfg.DATASET
    if bool(images) != bool(captions):
        raise UserInputError("--images and --captions go together (a folder and its captions JSON)")
    if images:
        items = read_caption_list(images, captions)
        source = box_source or "grid"
    else:
        if d.DATASET != "coco_captions":
            raise UserInputError("DATASET.DATASET is '{}'; attention maps read coco_captions, or your images "
                                 "with --images --captions".format(d.DATASET))
        source = box_source or "coco"
        items = read_coco_captions(d.DATASET_PATH, d.VAL_IMAGE_SET, d.ZIP_MODE, instance_boxes=source == "coco")
    attach_boxes(items, source, box_file)
    if max_items > 0:
        items = items[:max_items]
    return CaptionAttentionDataset(items, build_tokenizer(cfg.NETWORK.BERT_MODEL_NAME), seq_len=d.SEQ_LEN,
                                   add_image_as_a_box=d.ADD_IMAGE_AS_A_BOX, grid=parse_grid(grid),
                                   transform=build_transforms(cfg, "val"))


def _group(key):
    """What a key belongs to, for the load summary: ``vlbert``, ``vlbert.pooler`` (a head), ``final_mlp``, ..."""
    parts = key.split(".")
    return ".".join(parts[:2]) if key.startswith(NOT_BACKBONE_PREFIXES) else parts[0]


def build_model(cfg, ckpt):
    """The attention model with the checkpoint's VL-BERT and image encoder, fp32, eval mode, on the CPU or GPU."""
    if cfg.MODULE != MODULE:
        raise UserInputError("MODULE is '{}'; attention maps need {}".format(cfg.MODULE, MODULE))
    TASK.check_config(cfg)
    with held_random_init_warnings():  # the checkpoint sets the weights that matter; its report says which
        model = TASK.build_model(cfg)
    report = load_vlbert_backbone(model, ckpt, cfg.NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES)
    counts = {}
    for k in report.loaded:
        counts[_group(k)] = counts.get(_group(k), 0) + 1
    print("{}: loaded {} keys ({}); ignored {} keys of the file ({})".format(
        ckpt, len(report.loaded), ", ".join("{}.* {}".format(p, n) for p, n in sorted(counts.items())),
        len(report.unmatched), ", ".join(sorted({_group(k) + ".*" for k in report.unmatched})) or "none"))
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return model.float().to(device).eval(), device
