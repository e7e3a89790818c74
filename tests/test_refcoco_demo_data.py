"""RefCOCO+ demo data: REFER layout, plain pickle, true expressions that need the colours, detector-like boxes."""
import collections
import hashlib
import importlib.util
import json
import os

import numpy as np
import pytest
from PIL import Image

from common.fileio.safe_load import load_pickle
from refcoco.data.proposals import VGBoxes, load_mattnet_detections
from refcoco.data.refer import Refer
from refcoco.metrics import box_iou

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("make_refcoco_demo_data",
                                               os.path.join(ROOT, "demo", "make_refcoco_demo_data.py"))
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)

SIZES = {"train": 40, "val": 8, "testA": 4, "testB": 4}
# expressions of the photographs per split (REAL_REFS): train 22, val 4, testA 10, testB 5
REAL_COUNTS = {"train": 22, "val": 4, "testA": 10, "testB": 5}


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("demo_refcoco"))
    counts = demo.make_refcoco_demo_data(path, seed=0, sizes=SIZES, with_zip=True)
    assert counts == {s: REAL_COUNTS[s] + 4 * SIZES[s] for s in SIZES}
    return path


@pytest.fixture(scope="module")
def refer(out):
    return Refer(out)


def test_layout_and_plain_pickle(out, refer):
    refs = load_pickle(os.path.join(out, "refcoco+", "refs(unc).p"))
    assert isinstance(refs, list) and len(refs) == len(refer.refs) == 35 + 2 * sum(SIZES.values())  # 35 refs on the photographs
    assert {r["split"] for r in refs} == {"train", "val", "testA", "testB"}
    for ref in refs:
        assert ref["sent_ids"] == [s["sent_id"] for s in ref["sentences"]]
        assert all(s["tokens"] == s["sent"].split() for s in ref["sentences"])
    assert len({s["sent_id"] for r in refs for s in r["sentences"]}) == sum(len(r["sentences"]) for r in refs)
    names = set(os.listdir(os.path.join(out, "train2014")))
    assert names == {"COCO_train2014_{:012d}.jpg".format(i) for i in refer.images}
    for image in refer.images.values():
        with Image.open(os.path.join(out, "train2014", image["file_name"])) as im:
            assert im.mode == "RGB" and im.size == (image["width"], image["height"])
        for x1, y1, x2, y2 in refer.image_boxes(image["id"]).tolist():
            assert 0 <= x1 < x2 < image["width"] and 0 <= y1 < y2 < image["height"]


def test_photographs_keep_their_split(refer):
    photos = collections.defaultdict(set)
    for ref in refer.refs.values():
        if ref["image_id"] < demo.FIRST_SCENE_ID:
            photos[ref["image_id"]].add(ref["split"])
    assert len(photos) == 11 and all(len(s) == 1 for s in photos.values())


def color_at(image, box):
    """Name of the demo colour nearest to the pixel at the centre of ``box``."""
    x1, y1, x2, y2 = box
    rgb = np.asarray(image)[int((y1 + y2) / 2), int((x1 + x2) / 2)].astype(int)
    return min(demo.COLORS, key=lambda c: np.abs(rgb - np.array(demo.COLORS[c])).sum())


def test_shapes_expressions_are_true_and_need_the_colours(out, refer):
    kinds = collections.Counter()
    leftmost_overall_is_answer = []
    for ref_id, ref in refer.refs.items():
        if ref["image_id"] < demo.FIRST_SCENE_ID:
            continue
        image = Image.open(os.path.join(out, "train2014", refer.images[ref["image_id"]]["file_name"]))
        boxes = refer.image_boxes(ref["image_id"]).tolist()
        colors = [color_at(image, b) for b in boxes]
        target = boxes.index(refer.referred_box(ref_id).tolist())
        words = ref["sentences"][0]["tokens"]
        assert words[:3] == ["the", colors[target], "shape"]
        centre_x = [(b[0] + b[2]) / 2 for b in boxes]
        assert len(set(centre_x)) == 4  # one shape per column: left / right are well defined
        if len(words) == 3:  # "the green shape": the only one of its colour
            kinds["unique"] += 1
            assert colors.count(colors[target]) == 1
        else:  # "the red shape on the left": the left one of the two red shapes
            kinds["pair"] += 1
            assert words[3:5] == ["on", "the"] and colors.count(colors[target]) == 2
            same = [i for i in range(4) if colors[i] == colors[target]]
            pick = min if words[5] == "left" else max
            assert target == pick(same, key=lambda i: centre_x[i])
            overall = pick(range(4), key=lambda i: centre_x[i])
            leftmost_overall_is_answer.append(overall == target)
        assert ref["sentences"][1]["tokens"][-2:] == [colors[target], "one"]
    assert kinds["unique"] == kinds["pair"] == sum(SIZES.values())
    # the position word alone names the answer only about half of the time
    assert 0.25 < np.mean(leftmost_overall_is_answer) < 0.75


def test_detections_find_most_objects_and_add_wrong_boxes(out, refer):
    detections = load_mattnet_detections(os.path.join(out, "refcoco+", "proposal",
                                                       "res101_coco_minus_refer_notime_dets.json"))
    vg = VGBoxes(out)
    assert set(detections) == set(refer.images)
    for source in (detections.get, vg):
        found = []
        for image_id in refer.images:
            boxes, objects = source(image_id), refer.image_boxes(image_id)
            assert boxes.shape[0] >= 1
            found += (box_iou(objects, boxes).max(1).values > 0.5).tolist()
        assert 0.8 < np.mean(found) < 1.0


def test_same_seed_same_files(out, tmp_path):
    demo.make_refcoco_demo_data(str(tmp_path), seed=0, sizes=SIZES)

    def digest(root):
        names = ["refcoco+/refs(unc).p", "refcoco+/instances.json", "refcoco+/proposal/"
                 "res101_coco_minus_refer_notime_dets.json", "train2014/COCO_train2014_000000001003.jpg"]
        return [hashlib.sha256(open(os.path.join(root, n), "rb").read()).hexdigest() for n in names]
    assert digest(str(tmp_path)) == digest(out)
    categories = json.load(open(os.path.join(out, "refcoco+", "instances.json")))["categories"]
    assert {"person", "cat", "shape"} <= {c["name"] for c in categories}
