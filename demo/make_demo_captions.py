"""Write a small Conceptual Captions look-alike for the pretraining demo (no download), in the reference's layout.

Two parts, as the VCR demo data (``demo/make_demo_data.py``, whose scenes and photographs it reuses):

- generated scenes: four coloured shapes on a 96 x 96 canvas, captioned with their colours, shapes and
  positions ("a red circle at the top left , a blue square at the lower centre right , ...");
- the demo photographs (``skimage.data``), captioned with the objects of their VCR demo boxes.

The detector files hold what a detector would give, taken from the generator instead: the boxes;
``classes``, a 1601-way distribution putting 0.9 on the object's class (shapes: one class per
colour and shape, 1..16; photographs: one per object name, 17 on) and 0.1 on background (column 0);
``features``, 2048 numbers per box for the precomputed-feature configs: a fixed random projection
(seed 0) of the class one-hot and the box geometry. They are a stand-in, not a detector's features.

Output (``--out``, default data/demo/conceptual-captions)::

    train_frcnn.json  val_frcnn.json            caption index (JSON lines)
    train_image/*.jpg val_image/*.jpg            images
    train_frcnn/*.json val_frcnn/*.json          detector files

The index names the images as ``train_image.zip@/<name>.jpg`` (the reference's spelling), read from the
folders with ``DATASET.ZIP_MODE: false``.

Usage: python demo/make_demo_captions.py [--out DIR] [--train 400] [--val 40] [--seed 0]
"""
import argparse
import base64
import json
import os
import runpy

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = runpy.run_path(os.path.join(ROOT, "demo", "make_demo_data.py"))
NUM_CLASSES = 1601
FEATURE_DIM = 2048
ROWS = ("top", "upper", "lower", "bottom")
COLUMNS = ("left", "centre left", "centre right", "right")
SHAPE_CLASSES = {(c, s): 1 + i * len(DEMO["SHAPES"]) + j
                 for i, c in enumerate(DEMO["COLORS"]) for j, s in enumerate(DEMO["SHAPES"])}
PHOTO_NAMES = sorted({name for _, names, _, _ in DEMO["REAL"].values() for name in names})
PHOTO_CLASSES = {name: 1 + len(SHAPE_CLASSES) + i for i, name in enumerate(PHOTO_NAMES)}


def b64(array):
    """Base64 text of a little-endian float32 array (the detector file's encoding)."""
    return base64.b64encode(np.ascontiguousarray(array, dtype="<f4").tobytes()).decode("ascii")


def shape_caption(objects):
    """Caption tokens of a generated scene: each shape with its colour and position, left to right."""
    slots = DEMO["SLOTS"]
    parts = []
    for o in sorted(objects, key=lambda o: o["cx"]):
        row = ROWS[int(np.argmin([abs(o["cy"] - s) for s in slots]))]
        col = COLUMNS[int(np.argmin([abs(o["cx"] - s) for s in slots]))]
        parts.append("a {} {} at the {} {}".format(o["color"], o["shape"], row, col))
    return " , ".join(parts).split()


def photo_caption(names):
    """Caption tokens of a photograph: the objects of its boxes ("a photo of a cup , a spoon and a saucer")."""
    unique = list(dict.fromkeys(names))
    listed = " , ".join("a " + n for n in unique[:-1]) + (" and " if len(unique) > 1 else "") + "a " + unique[-1]
    return "a photo of {}".format(listed).split()


def detections(boxes, classes, width, height, projection):
    """Detector file fields for boxes (list of 4 floats) of the given class ids."""
    boxes = np.asarray(boxes, dtype=np.float32)
    scores = np.zeros((len(boxes), NUM_CLASSES), dtype=np.float32)
    scores[np.arange(len(boxes)), classes] = 0.9
    scores[:, 0] += 0.1
    geometry = boxes / np.array([width, height, width, height], dtype=np.float32)
    code = np.concatenate([np.eye(NUM_CLASSES, dtype=np.float32)[classes][:, :64], geometry], 1)
    features = np.maximum(code @ projection, 0.0)  # non-negative like pooled ReLU features
    return {"image_w": width, "image_h": height, "num_boxes": len(boxes), "boxes": b64(boxes),
            "classes": b64(scores), "features": b64(features)}


def write_item(out, split, name, image, caption, det, index):
    """Save the image and detector file of one item; returns its index line (dict)."""
    image.save(os.path.join(out, split + "_image", name + ".jpg"), quality=92)
    det = dict(det, image_id=index)
    with open(os.path.join(out, split + "_frcnn", name + ".json"), "w") as f:
        json.dump(det, f)
    return {"image": "{}_image.zip@/{}.jpg".format(split, name), "caption": caption,
            "frcnn": "{}_frcnn.zip@/{}.json".format(split, name)}


def make_demo_captions(out, sizes=(400, 40), seed=0):
    """Write the demo caption data under ``out``; returns ``{index file: number of captions}``.

    ``sizes``: generated scenes of train and val; every photograph goes to train once.
    """
    rng = np.random.RandomState(seed)
    projection = np.random.RandomState(0).randn(64 + 4, FEATURE_DIM).astype(np.float32) / 8.0
    counts = {}
    for split, size in zip(("train", "val"), sizes):
        os.makedirs(os.path.join(out, split + "_image"), exist_ok=True)
        os.makedirs(os.path.join(out, split + "_frcnn"), exist_ok=True)
        lines = []
        if split == "train":
            for name, (loader, names, boxes, _) in DEMO["REAL"].items():
                image = DEMO["real_image"](loader)
                det = detections(boxes, [PHOTO_CLASSES[n] for n in names], image.width, image.height, projection)
                lines.append(write_item(out, split, "real_" + name, image, photo_caption(names), det, len(lines)))
        for k in range(size):
            image, objects = DEMO["make_scene"](rng)
            classes = [SHAPE_CLASSES[(o["color"], o["shape"])] for o in objects]
            det = detections([o["box"] for o in objects], classes, image.width, image.height, projection)
            lines.append(write_item(out, split, "{}_{:05d}".format(split, k), image, shape_caption(objects), det,
                                    len(lines)))
        index = "{}_frcnn.json".format(split)
        with open(os.path.join(out, index), "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
        counts[index] = len(lines)
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "data", "demo", "conceptual-captions"),
                        help="output folder (default: %(default)s)")
    parser.add_argument("--train", type=int, default=400, help="generated training scenes (default: %(default)s)")
    parser.add_argument("--val", type=int, default=40, help="generated validation scenes (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for index, count in make_demo_captions(args.out, (args.train, args.val), args.seed).items():
        print("wrote {} captions to {}".format(count, os.path.join(args.out, index)))


if __name__ == "__main__":
    main()
