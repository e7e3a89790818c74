"""Write a small RefCOCO+-format data set for the demo and the tests (deterministic, a few seconds).

The layout is that of ``DATASET.DATASET_PATH`` for RefCOCO+ (data/PREPARE_DATA.md): COCO-named images,
the REFER files ``refcoco+/refs(unc).p`` (a plain pickle: lists, dicts, strings, numbers) and
``refcoco+/instances.json`` (COCO format), and both proposal sources. Two parts:

- real: the 11 photographs and hand-placed boxes of the VCR demo (``make_demo_data.REAL``) with
  hand-written referring expressions for some of their boxes. All refs of a photo share its split:
  5 photos train, 2 val, the 2 with people testA, 2 testB (RefCOCO+ puts people in testA).
- shapes (learnable): the VCR demo's 96x96 scenes of four shapes in four columns, coloured so that one
  colour appears twice and two colours once. Each scene has two refs: the shape of a unique colour
  ("the green shape") and one of the pair ("the red shape on the left"). The words never say where the
  unique-colour shape is, and "left" picks within the pair only, so box positions alone do not tell the
  answer: a model has to see the colours.

Proposals imitate a detector: every object is found with probability 0.9, its box moved by a few pixels,
and one wrong box is added per image (``refcoco+/proposal/res101_coco_minus_refer_notime_dets.json``,
MAttNet's format). The ``vg`` source gets the same kind of boxes, drawn separately
(``vgbua_res101_precomputed/trainval2014_resnet101_faster_rcnn_genome.zip``, base64 float32 rows).

Output (``--out``, default data/demo_refcoco):

    train2014/COCO_train2014_{image_id:012d}.jpg   photos are images 1-11, scenes 1000, 1001, ...
    train2014.zip                                  the same folder as a zip (``--zip``; DATASET.ZIP_MODE)
    refcoco+/refs(unc).p, refcoco+/instances.json
    refcoco+/proposal/res101_coco_minus_refer_notime_dets.json
    vgbua_res101_precomputed/trainval2014_resnet101_faster_rcnn_genome.zip

Usage: python demo/make_refcoco_demo_data.py [--out data/demo_refcoco] [--seed 0] [--train 1000]
       [--val 150] [--testA 60] [--testB 60] [--zip]        (numbers of shapes scenes per split)
"""
import argparse
import base64
import json
import os
import pickle
import sys
import zipfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_demo_data import COLORS, REAL, make_scene, real_image  # noqa: E402

SPLITS = ("train", "val", "testA", "testB")
# Shapes scenes per split (4 expressions each).
DEFAULT_SIZES = {"train": 1000, "val": 150, "testA": 60, "testB": 60}
FIRST_SCENE_ID = 1000
DETECTION_RECALL = 0.9
SHAPE_JITTER = 2       # px: largest shift of a detected shape's box side (IoU stays > 0.5)
PHOTO_JITTER = 0.04    # fraction of the box side, for the photographs
ANN_PER_IMAGE = 10     # ann_id = image_id * ANN_PER_IMAGE + object index

# Photo -> split, and (object index, expressions) per ref; the objects and boxes are those of REAL.
REAL_SPLITS = {"chelsea": "train", "coffee": "train", "rocket": "train", "motorcycle": "train", "coins": "train",
               "clock": "val", "text": "val", "astronaut": "testA", "camera": "testA", "hubble": "testB",
               "ihc": "testB"}
REAL_REFS = {
    "astronaut": [(0, ["woman in an orange space suit", "smiling astronaut"]),
                  (1, ["white model shuttle with an orange tank"]), (2, ["round clear helmet"]),
                  (3, ["striped flag"])],
    "camera": [(0, ["man in a dark coat looking through a camera", "photographer"]), (1, ["old film camera"]),
               (2, ["tripod with three legs"]), (3, ["tall building far away"])],
    "chelsea": [(0, ["orange tabby cat", "cat"]), (1, ["cat eye on the left"]), (2, ["cat eye on the right"]),
                (3, ["small pink nose"])],
    "coffee": [(0, ["white cup of espresso"]), (1, ["small metal spoon"]), (2, ["white saucer under the cup"]),
               (3, ["wooden table"])],
    "rocket": [(0, ["white rocket on the launch pad", "rocket"]), (1, ["steel tower on the left edge"]),
               (2, ["steel tower on the right edge"]), (3, ["thin tower next to the rocket"])],
    "motorcycle": [(0, ["red motorcycle", "motorbike"]), (1, ["bench behind the motorcycle"]),
                   (2, ["bicycle wheel at the edge"]), (3, ["small bottle on the shelf"]),
                   (4, ["cardboard box on the shelf"])],
    "coins": [(1, ["small coin in the top left corner"]), (2, ["large coin in the middle"])],
    "hubble": [(0, ["blue spiral galaxy"]), (1, ["orange glowing galaxy"]), (3, ["bright star with spikes"])],
    "ihc": [(0, ["brown stained gland in the corner"]), (3, ["tissue with blue nuclei"])],
    "clock": [(0, ["blurry round clock", "clock on the gray wall"])],
    "text": [(0, ["sheet of paper with handwriting"]), (2, ["handwritten formula in the middle"])],
}
SIDES = ("left", "right")


# ------------------------------------------------------------------------ records
class Writer:
    """Collects images, annotations, refs and boxes; ids are assigned in call order."""

    def __init__(self, out, rng):
        self.out, self.rng = out, rng
        self.images, self.annotations, self.refs, self.detections, self.vg = [], [], [], [], {}
        self.categories = {}
        os.makedirs(os.path.join(out, "train2014"), exist_ok=True)

    def add_image(self, image_id, image, objects, jitter):
        """Save ``image``, annotate ``objects`` (list of (category name, [x1, y1, x2, y2], polygon or None))
        and detect them (``jitter(box)``: largest shift of a side, px); returns the ann_ids."""
        image.save(os.path.join(self.out, "train2014", image_name(image_id)), quality=95)
        w, h = image.size
        self.images.append({"id": image_id, "width": w, "height": h, "file_name": image_name(image_id)})
        ann_ids = []
        for k, (name, box, polygon) in enumerate(objects):
            x1, y1, x2, y2 = [float(v) for v in box]
            polygon = polygon or [[x1, y1], [x2, y1], [x2, y2], [x1, y2]]
            ann_id = image_id * ANN_PER_IMAGE + k
            self.annotations.append({
                "id": ann_id, "image_id": image_id, "category_id": self.category(name),
                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0,
                "segmentation": [[float(c) for point in polygon for c in point]]})
            ann_ids.append(ann_id)
        boxes = [o[1] for o in objects]
        self.detections += [{"det_id": len(self.detections) + i, "image_id": image_id, "box": box,
                             "category_id": 1, "category_name": "object", "score": 0.9}
                            for i, box in enumerate(self.detect(boxes, w, h, jitter))]
        self.vg[image_id] = [[x, y, x + bw, y + bh] for x, y, bw, bh in self.detect(boxes, w, h, jitter)]
        return ann_ids

    def category(self, name):
        return self.categories.setdefault(name, len(self.categories) + 1)

    def add_ref(self, ann_id, split, sentences):
        ann = next(a for a in reversed(self.annotations) if a["id"] == ann_id)
        first = sum(len(r["sentences"]) for r in self.refs)
        sents = [{"tokens": s.lower().split(), "raw": s, "sent": s.lower(), "sent_id": first + i}
                 for i, s in enumerate(sentences)]
        self.refs.append({"ref_id": len(self.refs), "ann_id": ann_id, "image_id": ann["image_id"], "split": split,
                          "category_id": ann["category_id"], "sentences": sents,
                          "sent_ids": [s["sent_id"] for s in sents],
                          "file_name": "COCO_train2014_{:012d}_{}.jpg".format(ann["image_id"], ann_id)})

    def detect(self, boxes, width, height, jitter):
        """Detector-like ``[x, y, w, h]`` boxes: each object found with probability DETECTION_RECALL, moved
        a little, plus one box at a random place."""
        found = []
        for x1, y1, x2, y2 in boxes:
            if self.rng.rand() >= DETECTION_RECALL:
                continue
            most = jitter([x1, y1, x2, y2])
            x1, y1, x2, y2 = np.array([x1, y1, x2, y2]) + self.rng.uniform(-most, most, 4)
            found.append(_clip_xywh(x1, y1, x2, y2, width, height))
        w, h = self.rng.uniform(0.1, 0.5) * width, self.rng.uniform(0.1, 0.5) * height
        x, y = self.rng.uniform(0, width - w), self.rng.uniform(0, height - h)
        found.append(_clip_xywh(x, y, x + w, y + h, width, height))
        return found

    def write(self, with_zip):
        folder = os.path.join(self.out, "refcoco+")
        os.makedirs(os.path.join(folder, "proposal"), exist_ok=True)
        with open(os.path.join(folder, "refs(unc).p"), "wb") as f:
            pickle.dump(self.refs, f, protocol=2)  # plain data, as the REFER toolkit's Python 2 pickle
        categories = [{"id": i, "name": n, "supercategory": "object"} for n, i in self.categories.items()]
        with open(os.path.join(folder, "instances.json"), "w") as f:
            json.dump({"images": self.images, "annotations": self.annotations, "categories": categories}, f)
        with open(os.path.join(folder, "proposal", "res101_coco_minus_refer_notime_dets.json"), "w") as f:
            json.dump(self.detections, f)
        name = "trainval2014_resnet101_faster_rcnn_genome"
        os.makedirs(os.path.join(self.out, "vgbua_res101_precomputed"), exist_ok=True)
        with zipfile.ZipFile(os.path.join(self.out, "vgbua_res101_precomputed", name + ".zip"), "w") as z:
            for image in self.images:
                boxes = np.array(self.vg[image["id"]], np.float32).reshape(-1, 4)
                z.writestr("{}/{}.json".format(name, image["id"]), json.dumps({
                    "image_id": image["id"], "image_w": image["width"], "image_h": image["height"],
                    "num_boxes": len(boxes), "boxes": base64.b64encode(boxes.tobytes()).decode()}))
        if with_zip:
            with zipfile.ZipFile(os.path.join(self.out, "train2014.zip"), "w", zipfile.ZIP_STORED) as z:
                for image in self.images:
                    z.write(os.path.join(self.out, "train2014", image["file_name"]), "train2014/" + image["file_name"])


def image_name(image_id):
    return "COCO_train2014_{:012d}.jpg".format(image_id)


def _clip_xywh(x1, y1, x2, y2, width, height):
    x1, x2 = float(np.clip(x1, 0, width - 1)), float(np.clip(x2, 0, width - 1))
    y1, y2 = float(np.clip(y1, 0, height - 1)), float(np.clip(y2, 0, height - 1))
    return [round(x1, 2), round(y1, 2), round(x2 - x1, 2), round(y2 - y1, 2)]


# ------------------------------------------------------------------------ the two parts
def write_real(writer):
    """The photographs with their boxes and the refs of :data:`REAL_REFS`."""
    for image_id, (name, (loader, objects, boxes, _)) in enumerate(REAL.items(), 1):
        ann_ids = writer.add_image(image_id, real_image(loader), [(o, b, None) for o, b in zip(objects, boxes)],
                                   lambda box: PHOTO_JITTER * max(box[2] - box[0], box[3] - box[1]))
        for k, sentences in REAL_REFS[name]:
            writer.add_ref(ann_ids[k], REAL_SPLITS[name], sentences)


def scene_colors(rng):
    """Colour of each of 4 objects: one colour twice, two others once, in random order."""
    pair, *singles = rng.choice(list(COLORS), size=3, replace=False)
    return [str(c) for c in rng.permutation([pair, pair] + singles)]


def scene_refs(objects, rng):
    """The two refs of a scene: (object index, sentences) for a unique colour and for a side of the pair."""
    colors = [o["color"] for o in objects]
    pair = next(c for c in colors if colors.count(c) == 2)
    single = str(rng.choice([c for c in colors if colors.count(c) == 1]))
    side = SIDES[rng.randint(2)]
    members = sorted((i for i, c in enumerate(colors) if c == pair), key=lambda i: objects[i]["cx"])
    return [(colors.index(single), ["the {} shape".format(single), "{} one".format(single)]),
            (members[SIDES.index(side)], ["the {} shape on the {}".format(pair, side),
                                          "{} {} one".format(side, pair)])]


def write_shapes(writer, sizes, rng):
    """Scenes and refs of the learnable part; ``sizes`` maps split -> number of scenes."""
    image_id = FIRST_SCENE_ID
    for split in SPLITS:
        for _ in range(sizes[split]):
            image, objects = make_scene(rng, scene_colors(rng))
            ann_ids = writer.add_image(image_id, image, [("shape", o["box"], o["polygon"]) for o in objects],
                                       lambda box: SHAPE_JITTER)
            for k, sentences in scene_refs(objects, rng):
                writer.add_ref(ann_ids[k], split, sentences)
            image_id += 1


def make_refcoco_demo_data(out, seed=0, sizes=None, with_zip=False):
    """Write the demo data set under ``out``; returns ``{split: number of expressions}``.

    ``sizes`` maps split -> number of shapes scenes (default :data:`DEFAULT_SIZES`).
    """
    sizes = dict(DEFAULT_SIZES) if sizes is None else sizes
    rng = np.random.RandomState(seed)
    writer = Writer(out, rng)
    write_real(writer)
    write_shapes(writer, sizes, rng)
    writer.write(with_zip)
    return {split: sum(len(r["sentences"]) for r in writer.refs if r["split"] == split) for split in SPLITS}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                      "data", "demo_refcoco"), help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    for split, n in DEFAULT_SIZES.items():
        parser.add_argument("--" + split, type=int, default=n, help="shapes scenes in {}".format(split))
    parser.add_argument("--zip", action="store_true", help="also write train2014.zip (DATASET.ZIP_MODE)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    counts = make_refcoco_demo_data(args.out, args.seed, {s: getattr(args, s) for s in SPLITS}, args.zip)
    for split, n in counts.items():
        print("{:6s} {:5d} expressions".format(split, n))
    print("RefCOCO+ demo data written to {}".format(args.out))


if __name__ == "__main__":
    main()
