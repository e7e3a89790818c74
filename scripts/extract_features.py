"""Region features for your own images and boxes, in the reference's per-image JSON format or as TSV.

    python scripts/extract_features.py --boxes boxes.json --image-root data/my_images --out data/my_features \
        [--format json|tsv] [--cfg cfgs/vqa/base_4x16G_fp32.yaml] [--weights resnet101-pt-vgbua-0000.model] \
        [--device cuda] [--batch-size 8] [--opts KEY VALUE ...]

``boxes.json`` lists the images and their boxes (pixels of the image file, ``x1, y1, x2, y2``;
further numbers on a row, such as a score, are ignored)::

    [{"image_id": 9, "image": "COCO_val2014_000000000009.jpg", "boxes": [[10, 20, 200, 150], ...]}, ...]

Features come from the model's own image path (``common.modeling.fast_rcnn.FastRCNN`` as the end-to-end
model runs it: the config's SCALES resize and pixel normalisation, ResNet res2-res4, RoI Align, res5,
average pool), so they are the ``obj_reps_raw`` an end-to-end model with the same weights computes.
The ResNet comes from the config (``NETWORK.IMAGE_NUM_LAYERS``, ``IMAGE_STRIDE_IN_1x1``,
``IMAGE_C5_DILATED``) and its weights from ``--weights FILE`` (a whole-ResNet state dict such as the
reference's ``resnet101-pt-vgbua-0000.model``) or ``NETWORK.IMAGE_PRETRAINED`` /
``IMAGE_PRETRAINED_EPOCH``. The whole image is encoded as one more box (``image_box_feature`` in
the JSON files; the TSV format has no field for it).

Output: ``--format json`` writes ``<out>/<image_id>.json``; ``--format tsv`` writes the file ``<out>``.
"""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.cli import run_main  # noqa: E402
from common.data.box_sources import read_box_list  # noqa: E402
from common.data.loading import load_image  # noqa: E402
from common.data.region_features import (RegionFeatures, feature_json_path, write_feature_json,  # noqa: E402
                                         write_tsv)
from common.data.transforms import build_transforms  # noqa: E402
from common.errors import UserInputError  # noqa: E402
from common.modeling.fast_rcnn import FastRCNN  # noqa: E402
from vqa.task import TASK  # noqa: E402

DEFAULT_CFG = os.path.join(ROOT, "cfgs", "vqa", "base_4x16G_fp32.yaml")


def parse_args(argv=None):
    parser = argparse.ArgumentParser("Extract region features with the project's ResNet")
    parser.add_argument("--boxes", required=True, help="JSON list of {image_id, image, boxes}")
    parser.add_argument("--image-root", default="", help="folder the 'image' paths are relative to")
    parser.add_argument("--out", required=True, help="output folder (json) or file (tsv)")
    parser.add_argument("--format", choices=("json", "tsv"), default="json", help="output format")
    parser.add_argument("--cfg", default=DEFAULT_CFG, help="config giving the ResNet, SCALES and PIXEL_MEANS/STDS")
    parser.add_argument("--weights", help="ResNet state dict file (instead of NETWORK.IMAGE_PRETRAINED)")
    parser.add_argument("--batch-size", type=int, default=8,
                        help="images per forward; consecutive images of one size only (no padding)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides as KEY VALUE pairs")
    return parser.parse_args(argv)


def build_extractor(args):
    """``(FastRCNN in eval mode on args.device, test transform)`` from the config and weights."""
    opts = list(args.opts) + ["NETWORK.IMAGE_FEAT_PRECOMPUTED", "false", "NETWORK.IMAGE_SEMANTIC", "false"]
    if args.weights:
        opts += ["NETWORK.IMAGE_PRETRAINED", ""]
    cfg = TASK.load_config(args.cfg, opts)
    model = FastRCNN(cfg)
    if args.weights:
        if not os.path.isfile(args.weights):
            raise FileNotFoundError("--weights: '{}' does not exist".format(args.weights))
        model.pretrained_path = args.weights
    try:
        model.init_weight()
    except (ValueError, RuntimeError) as e:  # a file of another network or another ResNet depth
        raise UserInputError("ResNet weights '{}': {}".format(model.pretrained_path, e)) from None
    return model.eval().to(args.device), build_transforms(cfg, "test")


@torch.no_grad()
def extract(model, transform, images, boxes, device):
    """Features of each image's boxes and of the whole image, for images of one size (one forward).

    Args:
        images: ``PIL.Image`` list, all of the same size (so their tensors stack without padding,
            which would change the features at the borders).
        boxes: float32 ``[N_i, 4]`` tensor per image, pixels of that image.
    Returns:
        list of (float32 ``[N_i, C]``, float32 ``[C]``) numpy array pairs, C = the ResNet's res5 width.
    """
    samples = []
    for image, b in zip(images, boxes):
        w, h = image.size
        all_boxes = torch.cat((torch.tensor([[0.0, 0.0, w - 1.0, h - 1.0]]), b))
        samples.append(transform({"image": image, "boxes": all_boxes, "im_info": torch.tensor([w, h, 1.0, 1.0, 0.0])}))
    most = max(len(s["boxes"]) for s in samples)
    padded = torch.zeros(len(samples), most, 4)
    mask = torch.zeros(len(samples), most, dtype=torch.bool)
    for i, s in enumerate(samples):
        padded[i, :len(s["boxes"])] = s["boxes"]
        mask[i, :len(s["boxes"])] = True
    feats = model(torch.stack([s["image"] for s in samples]).to(device), padded.to(device), mask.to(device),
                  torch.stack([s["im_info"] for s in samples]).to(device))["obj_reps_raw"].float().cpu().numpy()
    return [(f[1:len(s["boxes"])], f[0]) for f, s in zip(feats, samples)]


def same_size_batches(entries, image_root, batch_size):
    """Consecutive entries as (entries, images) groups of up to ``batch_size`` images of one size."""
    group, images = [], []
    for e in entries:
        image = load_image(os.path.join(image_root, e["image"]))
        if group and (len(group) == batch_size or image.size != images[0].size):
            yield group, images
            group, images = [], []
        group.append(e)
        images.append(image)
    if group:
        yield group, images


def main(argv=None):
    args = parse_args(argv)
    entries = read_box_list(args.boxes)
    model, transform = build_extractor(args)

    def regions():
        for group, images in same_size_batches(entries, args.image_root, args.batch_size):
            outputs = extract(model, transform, images, [e["boxes"] for e in group], args.device)
            for e, image, (features, image_box_feature) in zip(group, images, outputs):
                yield RegionFeatures(image_id=e["image_id"], image_w=image.size[0], image_h=image.size[1],
                                     boxes=e["boxes"].numpy(), features=features, image_box_feature=image_box_feature)

    if args.format == "tsv":
        write_tsv(args.out, regions())
    else:
        os.makedirs(args.out, exist_ok=True)
        for r in regions():
            write_feature_json(feature_json_path(args.out, r.image_id), r)
    print("{}: features of {} images ({} format)".format(args.out, len(entries), args.format))


if __name__ == "__main__":
    run_main(main)
