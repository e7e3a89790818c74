"""Region features for your own images, in the reference's per-image JSON format or as TSV, with boxes
from a file, a regular grid or a detector; optionally a Conceptual-Captions-style index for pretraining.

    python tools/extract_features.py --box-source file --boxes boxes.json --image-root data/my_images \
        --out data/my_features [common options]
    python tools/extract_features.py --box-source grid --grid 4x4 --image-root data/my_images --out ...
    python tools/extract_features.py --box-source detector --detector-weights \
        model/pretrained_model/fasterrcnn_resnet50_fpn_v2_coco-dd69338a.pth --image-root data/my_images --out ...
    common options: [--format json|tsv] [--cfg cfgs/vqa/base_4x16G_fp32.yaml] [--encoder resnet|vit]
        [--weights resnet101-pt-vgbua-0000.model]
        [--captions captions.json [--index DATASET_PATH/train_frcnn.json]] [--device cuda] [--batch-size 8]
        [--max-skipped-share 0.01] [--opts KEY VALUE ...]

Box sources (``--box-source``, default ``file``):

- ``file``: ``--boxes boxes.json`` lists the images and their boxes (pixels of the image file,
  ``x1, y1, x2, y2``; further numbers on a row, such as a score, are ignored)::

      [{"image_id": 9, "image": "COCO_val2014_000000000009.jpg", "boxes": [[10, 20, 200, 150], ...]}, ...]

- ``grid``: ``--grid ROWSxCOLS`` cells over each image, after the whole image as box 0 (no detector).
- ``detector``: a torchvision two-stage detector (``--detector``, default ``fasterrcnn_resnet50_fpn_v2``)
  with weights from ``--detector-weights`` (read weights-only; nothing is downloaded), regions chosen as
  the bottom-up-attention features were (``common.data.box_sources.select_regions``: score >= 0.2 after a
  per-class NMS at IoU 0.3, 10 to 100 regions); each region's class distribution goes into the JSON file
  as ``classes`` (pretraining's masked-region targets).

With ``grid`` and ``detector`` the images are every image file under ``--image-root`` (by extension,
sorted, subfolders included), or those listed in ``--image-list`` (one path a line, relative to
``--image-root``); an image's id is its file name without the extension (an int when all digits). An
image that cannot be decoded is named in a warning and skipped; the summary counts them, and more than
``--max-skipped-share`` of the images (1%, pretraining's ``DATASET.MAX_SKIPPED_SHARE``) stops the run.

Features come from the model's own image path, the encoder ``NETWORK.IMAGE_ENCODER`` names
(``common.modeling.image_encoder``) as the end-to-end model runs it: the config's SCALES resize and pixel
normalisation, then ResNet res2-res4, RoI Align, res5 and an average pool (``resnet``) or the ViT's patch
map and RoI Align over it (``vit``), so they are the ``obj_reps_raw`` an end-to-end model with the same
weights computes. The ResNet comes from the config (``NETWORK.IMAGE_NUM_LAYERS``, ``IMAGE_STRIDE_IN_1x1``,
``IMAGE_C5_DILATED``), the ViT from ``NETWORK.IMAGE_VIT_ARCH`` / ``IMAGE_VIT_ARCH_KWARGS``; the weights from
``--weights FILE`` (a whole-ResNet state dict such as the reference's ``resnet101-pt-vgbua-0000.model``, or
a timm ViT ``.safetensors`` / ``.pth``) or ``NETWORK.IMAGE_PRETRAINED``. The whole image is encoded as one
more box (``image_box_feature`` in the JSON files; the TSV format has no field for it).

Output: ``--format json`` writes ``<out>/<image_id>.json`` (what VQA, RefCOCO+ and pretraining read);
``--format tsv`` writes the file ``<out>``. ``--captions captions.json`` (``{"<image path as in boxes.json or
relative to --image-root>": "a caption" or ["a caption", ...]}``) also writes ``--index`` (default
``<out>/../train_frcnn.json``), one line per caption as ``pretrain/data/conceptual_captions.py`` reads it,
paths relative to the index's folder (use that folder as the pretraining's ``DATASET.DATASET_PATH``).
"""
import argparse
import json
import os
import sys

import torch
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.cli import run_main  # noqa: E402
from common.data.box_sources import (CONF_THRESH, DEFAULT_DETECTOR, MAX_BOXES, MIN_BOXES, NMS_IOU, DetectorBoxes,  # noqa: E402
                                     grid_boxes, parse_grid, read_box_list)
from common.data.loading import load_image, load_json  # noqa: E402
from common.data.region_features import (RegionFeatures, feature_json_path, image_id_from_name,  # noqa: E402
                                         write_feature_json, write_tsv)
from common.data.skips import SkipCounter, read_or_skip  # noqa: E402
from common.errors import UserInputError  # noqa: E402
from common.modeling.image_encoder import switch_encoder_opts  # noqa: E402
from common.modeling.region_extractor import EXTRACTOR_OPTS, build_region_extractor, extract_regions  # noqa: E402
from vqa.task import TASK  # noqa: E402

DEFAULT_CFG = os.path.join(ROOT, "cfgs", "vqa", "base_4x16G_fp32.yaml")

# Pretraining's default DATASET.MAX_SKIPPED_SHARE.
MAX_SKIPPED_SHARE = 0.01


def parse_args(argv=None):
    parser = argparse.ArgumentParser("Extract region features with the project's image encoder")
    parser.add_argument("--box-source", choices=("file", "grid", "detector"), default="file",
                        help="where the boxes come from (default: file, --boxes)")
    parser.add_argument("--boxes", help="box source 'file': JSON list of {image_id, image, boxes}")
    parser.add_argument("--image-root", default="", help="folder the image paths are relative to")
    parser.add_argument("--image-list", help="grid / detector: file of image paths, one a line (default: every "
                        "image file under --image-root)")
    parser.add_argument("--grid", default="4x4", help="box source 'grid': ROWSxCOLS (default 4x4)")
    parser.add_argument("--detector", default=DEFAULT_DETECTOR, help="box source 'detector': torchvision model name")
    parser.add_argument("--detector-weights", help="box source 'detector': its weights file (.pth / .safetensors)")
    parser.add_argument("--detector-min-size", type=int, default=800, help="detector's shorter side (px)")
    parser.add_argument("--detector-max-size", type=int, default=1333, help="detector's longer side at most (px)")
    parser.add_argument("--conf-thresh", type=float, default=CONF_THRESH, help="detector: smallest kept score")
    parser.add_argument("--nms-iou", type=float, default=NMS_IOU, help="detector: IoU of the per-class NMS")
    parser.add_argument("--min-boxes", type=int, default=MIN_BOXES, help="detector: regions per image at least")
    parser.add_argument("--max-boxes", type=int, default=MAX_BOXES, help="detector: regions per image at most")
    parser.add_argument("--out", required=True, help="output folder (json) or file (tsv)")
    parser.add_argument("--format", choices=("json", "tsv"), default="json", help="output format")
    parser.add_argument("--captions", help="JSON {image: caption or [captions]}: also write a caption index")
    parser.add_argument("--index", help="caption index to write (default: <out>/../train_frcnn.json)")
    parser.add_argument("--max-skipped-share", type=float, default=MAX_SKIPPED_SHARE,
                        help="share of undecodable images tolerated (default 0.01)")
    parser.add_argument("--cfg", default=DEFAULT_CFG, help="config giving the image encoder, SCALES and PIXEL_MEANS/STDS")
    parser.add_argument("--encoder", choices=("resnet", "vit"),
                        help="image encoder instead of the config's NETWORK.IMAGE_ENCODER (the other encoder's keys "
                        "go back to their defaults; set the ViT with --opts NETWORK.IMAGE_VIT_ARCH ...)")
    parser.add_argument("--weights", help="image encoder weights file (instead of NETWORK.IMAGE_PRETRAINED)")
    parser.add_argument("--batch-size", type=int, default=8,
                        help="images per forward; consecutive images of one size only (no padding)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides as KEY VALUE pairs")
    args = parser.parse_args(argv)
    if (args.box_source == "file") != (args.boxes is not None):
        raise UserInputError("--boxes goes with --box-source file (the default), and only with it")
    if args.box_source == "detector" and not args.detector_weights:
        raise UserInputError("--box-source detector needs --detector-weights FILE (nothing is downloaded; see "
                             "data/PREPARE_DATA.md, 'Features for your own images')")
    if args.captions and args.format != "json":
        raise UserInputError("--captions needs --format json (the caption index points at per-image JSON files)")
    for name in ("max_skipped_share", "conf_thresh", "nms_iou"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise UserInputError("--{}: expected a number in [0, 1], got {}".format(name.replace("_", "-"),
                                                                                  getattr(args, name)))
    if not 1 <= args.min_boxes <= args.max_boxes:
        raise UserInputError("--min-boxes {} / --max-boxes {}: expected 1 <= min <= max".format(args.min_boxes,
                                                                                              args.max_boxes))
    return args


def list_images(image_root, image_list=None):
    """``{image_id, image}`` entries (``boxes`` None) of the images to box: the lines of ``image_list``, or
    every file under ``image_root`` whose extension PIL decodes, sorted.

    ``image_id``: :func:`common.data.region_features.image_id_from_name`.

    Raises:
        UserInputError: no image at all, or two images with one id (names both files).
        FileNotFoundError: ``image_list`` or ``image_root`` does not exist.
    """
    if image_list:
        with open(image_list, encoding="utf-8") as f:
            names = [line.strip() for line in f if line.strip()]
        where = image_list
    else:
        if not os.path.isdir(image_root):
            raise FileNotFoundError("--image-root '{}' is not a folder".format(image_root))
        extensions = {e.lower() for e in Image.registered_extensions()}
        names = sorted(os.path.relpath(os.path.join(folder, n), image_root)
                       for folder, _, files in os.walk(image_root) for n in files
                       if os.path.splitext(n)[1].lower() in extensions)
        where = "--image-root {}".format(image_root)
    if not names:
        raise UserInputError("{}: no image file".format(where))
    entries, seen = [], {}
    for name in names:
        image_id = image_id_from_name(name)
        if str(image_id) in seen:
            raise UserInputError("{}: {} and {} would both get image_id {} (the file name without its extension); "
                                 "rename one".format(where, seen[str(image_id)], name, image_id))
        seen[str(image_id)] = name
        entries.append({"image_id": image_id, "image": name, "boxes": None})
    return entries


def box_source(args):
    """``boxes_for(entry, image) -> (float32 [N, 4] boxes, float32 [N, C] class distributions or None)``
    of ``--box-source``."""
    if args.box_source == "file":
        return lambda entry, image: (entry["boxes"], None)
    if args.box_source == "grid":
        rows, cols = parse_grid(args.grid)
        return lambda entry, image: (grid_boxes(image.size[0], image.size[1], rows, cols, name=entry["image"]), None)
    detector = DetectorBoxes(args.detector, args.detector_weights, args.device, args.detector_min_size,
                             args.detector_max_size, args.conf_thresh, args.nms_iou, args.min_boxes, args.max_boxes)
    return lambda entry, image: detector(image)


def build_extractor(args):
    """``(image encoder in eval mode on args.device, test transform)`` from the config (``NETWORK.IMAGE_ENCODER``,
    ``common.modeling.image_encoder``) and weights (:func:`common.modeling.region_extractor.build_region_extractor`)."""
    opts = switch_encoder_opts(TASK.defaults(), args.encoder) if args.encoder else []
    opts += list(args.opts) + list(EXTRACTOR_OPTS)
    if args.weights:
        opts += ["NETWORK.IMAGE_PRETRAINED", ""]
    return build_region_extractor(TASK.load_config(args.cfg, opts), args.weights, args.device)


def same_size_batches(pairs, batch_size):
    """Consecutive ``(entry, image)`` pairs as (entries, images) groups of up to ``batch_size`` images of one size."""
    group, images = [], []
    for e, image in pairs:
        if group and (len(group) == batch_size or image.size != images[0].size):
            yield group, images
            group, images = [], []
        group.append(e)
        images.append(image)
    if group:
        yield group, images


def read_captions(path, entries):
    """``{image path: [caption, ...]}`` of a captions file, every key one of the ``entries``' images.

    Raises:
        UserInputError: not a JSON object of strings or string lists, or a key that names no image
            (names the file and the key).
    """
    captions = load_json(path)
    if not isinstance(captions, dict):
        raise UserInputError("{}: expected a JSON object {{\"<image>\": \"caption\" or [\"caption\", ...]}}"
                             .format(path))
    images = {e["image"] for e in entries}
    out = {}
    for image, text in captions.items():
        texts = [text] if isinstance(text, str) else text
        if not (isinstance(texts, list) and texts and all(isinstance(t, str) and t.strip() for t in texts)):
            raise UserInputError("{}: '{}': expected a caption or a list of captions (non-empty strings), got {!r}"
                                 .format(path, image, text))
        if image not in images:
            raise UserInputError("{}: '{}' is none of the images to extract (paths as in {})".format(
                path, image, "--boxes" if images and entries[0].get("boxes") is not None else "--image-root"))
        out[image] = texts
    return out


def write_caption_index(index, captions, written, image_root, out):
    """Write the caption index ``index``: one ``{"image", "caption", "frcnn"}`` line per caption of an
    image in ``written`` (``{image path: image_id}``), caption split into words, paths relative to the
    index's folder. Returns the number of lines."""
    folder = os.path.dirname(os.path.abspath(index))
    lines = 0
    with open(index, "w", encoding="utf-8") as f:
        for image, texts in captions.items():
            if image not in written:  # skipped: undecodable
                continue
            frcnn = os.path.relpath(os.path.abspath(feature_json_path(out, written[image])), folder)
            path = os.path.relpath(os.path.abspath(os.path.join(image_root, image)), folder)
            for text in texts:
                f.write(json.dumps({"image": path, "caption": text.split(), "frcnn": frcnn}) + "\n")
                lines += 1
    return lines


def main(argv=None):
    args = parse_args(argv)
    entries = read_box_list(args.boxes) if args.boxes else list_images(args.image_root, args.image_list)
    captions = read_captions(args.captions, entries) if args.captions else None
    boxes_for = box_source(args)
    model, transform = build_extractor(args)
    skips = SkipCounter("image", max_share=args.max_skipped_share, min_seen=len(entries), log_first=len(entries),
                        setting="--max-skipped-share")
    written = {}

    def readable():
        for e in entries:
            image = read_or_skip(load_image, os.path.join(args.image_root, e["image"]), skips)
            if image is not None:
                boxes, classes = boxes_for(e, image)
                yield dict(e, boxes=boxes, classes=classes), image

    def regions():
        for group, images in same_size_batches(readable(), args.batch_size):
            outputs = extract_regions(model, transform, images, [e["boxes"] for e in group], args.device)
            for e, image, (features, image_box_feature) in zip(group, images, outputs):
                written[e["image"]] = e["image_id"]
                yield RegionFeatures(image_id=e["image_id"], image_w=image.size[0], image_h=image.size[1],
                                     boxes=e["boxes"].numpy(), features=features, image_box_feature=image_box_feature,
                                     classes=None if e["classes"] is None else e["classes"].numpy())

    if args.format == "tsv":
        write_tsv(args.out, regions())
    else:
        os.makedirs(args.out, exist_ok=True)
        for r in regions():
            write_feature_json(feature_json_path(args.out, r.image_id), r)
    print("{}: features of {} images ({} format, boxes from {}); {} skipped (could not be decoded){}".format(
        args.out, len(written), args.format, args.box_source, skips.skipped,
        ": " + "; ".join(skips.first) if skips.skipped else ""))
    if captions is not None:
        index = args.index or os.path.join(os.path.dirname(os.path.abspath(args.out)), "train_frcnn.json")
        lines = write_caption_index(index, captions, written, args.image_root, args.out)
        print("{}: {} captions of {} images (a caption index for pretraining)".format(
            index, lines, len(set(captions) & set(written))))


if __name__ == "__main__":
    run_main(main)
