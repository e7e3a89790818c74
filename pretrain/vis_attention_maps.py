"""Attention maps of a VL-BERT checkpoint on image-caption pairs (the reference's ``pretrain/vis_attention_maps.py``).

    python pretrain/vis_attention_maps.py --cfg cfgs/pretrain/vis_attention_maps_coco.yaml --ckpt CKPT \
        [--out DIR] [--images FOLDER --captions FILE] [--box-source coco|grid|file|features] [--box-file PATH] \
        [--grid 3x3] [--max-items N] [--raw-only] [--opts KEY VALUE ...]

Items: the config's ``coco_captions`` split ``DATASET.VAL_IMAGE_SET`` (boxes: its COCO instances), or with
``--images --captions`` a folder of images and a JSON list of ``{"image", "caption"}`` (boxes: a grid); box
sources and formats in ``pretrain/data/coco_captions.py``. ``--ckpt`` (default NETWORK.PARTIAL_PRETRAIN) may be
a checkpoint of any VL-BERT task: its VL-BERT and image-encoder weights are loaded, task heads ignored, and the
keys used are printed; ``NETWORK.VLBERT`` must describe its VL-BERT (``--opts`` or a config such as
``cfgs/pretrain/vis_attention_maps_demo.yaml``).

The model runs in fp32, one item at a time, through the eager attention path that returns the probabilities
(``ResNetVLBERTForAttentionVis``). Output (default ``<OUTPUT_PATH>/<cfg name>/<image set>_attention``):
``attention_probs/ID.npy`` + ``ID.json`` and the PNGs under ``maps/ID/`` (``pretrain/function/attention_maps.py``).
Images that are missing or do not decode are named, skipped and counted.
"""
import argparse
import os

import _init_paths  # noqa: F401
import torch

from common.cli import output_folder, run_main
from common.data.collate import BatchCollator, canvas_scales
from common.errors import UserInputError
from pretrain.data.coco_captions import BOX_SOURCES, UnreadableImageError
from pretrain.function.attention_maps import write_maps, write_raw
from pretrain.function.vis import build_items, build_model
from pretrain.task import TASK


def parse_args(argv=None):
    parser = argparse.ArgumentParser("Attention maps of a VL-BERT checkpoint")
    parser.add_argument("--cfg", required=True, help="config (MODULE ResNetVLBERTForAttentionVis)")
    parser.add_argument("--ckpt", help="checkpoint of any VL-BERT task (default: NETWORK.PARTIAL_PRETRAIN)")
    parser.add_argument("--out", help="output folder (default: <OUTPUT_PATH>/<cfg name>/<image set>_attention)")
    parser.add_argument("--images", help="folder of your images (instead of the config's data set)")
    parser.add_argument("--captions", help="with --images: JSON list of {\"image\": FILE, \"caption\": TEXT}")
    parser.add_argument("--box-source", choices=BOX_SOURCES,
                        help="coco (default for the config's data set), grid (default for --images), file, features")
    parser.add_argument("--box-file", help="boxes JSON (file) or folder of <image_id>.json feature files (features)")
    parser.add_argument("--grid", default="3x3", help="ROWSxCOLS of the grid box source")
    parser.add_argument("--max-items", type=int, default=0, help="stop after this many items (0: all)")
    parser.add_argument("--raw-only", action="store_true", help="write the .npy and .json files, no PNG maps "
                        "(drawing takes about a second per figure on a CPU)")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides as KEY VALUE pairs")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cfg = TASK.load_config(args.cfg, args.opts)
    ckpt = args.ckpt or cfg.NETWORK.PARTIAL_PRETRAIN
    if not ckpt:
        raise UserInputError("no checkpoint: give --ckpt (or NETWORK.PARTIAL_PRETRAIN)")
    if not os.path.isfile(ckpt):
        raise UserInputError("checkpoint '{}' not found (--ckpt)".format(ckpt))
    out = args.out or output_folder(cfg, args.cfg, cfg.DATASET.VAL_IMAGE_SET + "_attention")
    dataset = build_items(cfg, args.images, args.captions, args.box_source, args.box_file, args.grid, args.max_items)
    model, device = build_model(cfg, ckpt)
    collate = BatchCollator(dataset.data_names, scales=canvas_scales(cfg))
    written = skipped = 0
    for index, item in enumerate(dataset.items):
        try:
            sample, info = dataset.load(index)
        except UnreadableImageError as e:
            skipped += 1
            print("skipped: {}".format(e))
            continue
        batch = [x.to(device) for x in collate([sample])]
        with torch.no_grad():  # fp32: no autocast, the maps are computed in full precision
            probs = model(*batch)["attention_probs"][0].cpu().numpy()
        num_text, num_regions = len(sample[3]), len(info["boxes"])
        text, regions = (0, num_text), (num_text, num_text + num_regions)
        record = {"image_id": item.image_id, "image": item.image, "caption": item.caption,
                  "image_size": list(info["image"].size), "checkpoint": ckpt, "tokens": info["tokens"] + ["[END]"],
                  "text": list(text), "regions": list(regions), "boxes": info["boxes"].tolist()}
        write_raw(out, item.image_id, probs, record)
        if not args.raw_only:
            write_maps(out, item.image_id, probs, record["tokens"], text, regions, info["image"], info["boxes"])
        written += 1
    print("{}: attention maps of {} item(s); {} skipped (image missing or not decodable) of {}".format(
        out, written, skipped, len(dataset)))
    return out


if __name__ == "__main__":
    run_main(main)
