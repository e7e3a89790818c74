"""demo/make_vqa_demo_data.py: the VQA-format demo in the official layout, whose learnable answers
are in the pixels (checked against the pixels here), read by the project's own readers."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from vqa.data.answers import AnswerVocab
from vqa.data.vqa_files import check_same_split, load_annotations, load_questions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLORS = {"red": (215, 40, 40), "green": (40, 170, 60), "blue": (45, 80, 215), "yellow": (230, 205, 35)}


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("demo_vqa"))
    proc = subprocess.run([sys.executable, "demo/make_vqa_demo_data.py", "--out", path, "--train", "40",
                           "--val", "10", "--test", "6"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return path


def _file(out, kind, split):
    name = "v2_OpenEnded_mscoco_{}_questions.json" if kind == "q" else "v2_mscoco_{}_annotations.json"
    return os.path.join(out, "vqa", name.format(split))


def _box_colors(out, entry):
    """Name of the demo colour nearest to the pixel at each box's centre."""
    image = np.asarray(Image.open(os.path.join(out, entry["image"])).convert("RGB"), dtype=float)
    names = []
    for x1, y1, x2, y2 in entry["boxes"]:
        pixel = image[int((y1 + y2) / 2), int((x1 + x2) / 2)]
        names.append(min(COLORS, key=lambda c: np.abs(pixel - COLORS[c]).sum()))
    return names


def test_splits_in_the_official_layout(out):
    counts = {}
    for split in ("train2014", "val2014"):
        questions, annotations = load_questions(_file(out, "q", split)), load_annotations(_file(out, "a", split))
        check_same_split(questions, annotations, split, split)
        counts[split] = len(questions)
    counts["test2015"] = len(load_questions(_file(out, "q", "test2015")))
    # 11 photographs x 3 questions, one per split; the scenes' questions (2 per scene) as asked
    assert counts == {"train2014": 40 + 11, "val2014": 10 + 11, "test2015": 6 + 11}
    vocab = AnswerVocab.from_file(os.path.join(out, "vqa", "answers_vqa.txt"))
    train = load_annotations(_file(out, "a", "train2014"))
    assert all(a["multiple_choice_answer"] in vocab or a["answer_type"] == "other" for a in train)
    shapes = load_annotations(os.path.join(out, "vqa", "v2_mscoco_val2014_shapes_annotations.json"))
    assert len(shapes) == 10 and all(a["image_id"] >= 1000 for a in shapes)


def test_scene_answers_are_in_the_pixels(out):
    boxes = {e["image_id"]: e for e in json.load(open(os.path.join(out, "boxes_trainval.json")))}
    annotations = load_annotations(_file(out, "a", "train2014"))
    questions = {q["question_id"]: q["question"] for q in load_questions(_file(out, "q", "train2014"))}
    checked = 0
    for a in annotations:
        if a["image_id"] < 1000:
            continue
        entry = boxes[a["image_id"]]
        colors = _box_colors(out, entry)
        words = questions[a["question_id"]].split()
        if words[0] == "how":  # how many <colour> shapes are there ?
            assert a["multiple_choice_answer"] == str(colors.count(words[2]))
        else:  # what color is the <leftmost|rightmost|topmost|bottommost> shape ?
            key, sign = {"leftmost": (0, -1), "rightmost": (0, 1), "topmost": (1, -1), "bottommost": (1, 1)}[words[4]]
            centre = [(b[key] + b[key + 2]) / 2 * sign for b in entry["boxes"]]
            assert a["multiple_choice_answer"] == colors[int(np.argmax(centre))]
        assert sum(x["answer"] == a["multiple_choice_answer"] for x in a["answers"]) >= 8
        checked += 1
    assert checked == 40
    # every box of a scene has the same size: the boxes alone do not tell the answers
    assert {(b[2] - b[0], b[3] - b[1]) for e in boxes.values() if e["image_id"] >= 1000 for b in e["boxes"]} \
        == {(18, 18)}


def test_every_image_is_listed_once_for_the_extractor(out):
    for part in ("trainval", "test2015"):
        entries = json.load(open(os.path.join(out, "boxes_{}.json".format(part))))
        ids = [e["image_id"] for e in entries]
        assert len(ids) == len(set(ids)) and all(os.path.isfile(os.path.join(out, e["image"])) for e in entries)


def test_every_photo_of_every_split_has_its_boxes_in_the_demos_recorded_box_source(out):
    """The box source demo/run_demo_vqa.sh records next to the checkpoint (its feature_extractor.json) lists
    every photo of the three splits, the val2014 copies of train2014 photographs too (issue 39, row g): none
    falls back to the grid."""
    import re
    import warnings

    from common.inference.predictor import recorded_box_source

    with open(os.path.join(ROOT, "demo", "run_demo_vqa.sh")) as f:
        record = json.loads(re.search(r'feature_extractor.json" <<JSON\n(.*?)\nJSON', f.read(), re.S).group(1)
                            .replace("$DATA", out).replace("$CFG", "cfgs/vqa/demo_cpu.yaml"))
    source = recorded_box_source(record["box_source"], "cpu")
    assert source.fallback.describe() == "grid 4x4"
    trainval = {e["image_id"]: e for e in json.load(open(os.path.join(out, "boxes_trainval.json")))}
    copies = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback would warn
        for split in ("train2014", "val2014", "test2015"):
            for name in sorted(os.listdir(os.path.join(out, split))):
                path = os.path.join(out, split, name)
                boxes = source(Image.open(path), path)
                assert boxes.shape[0] >= 1 and boxes.shape[1] == 4
                image_id = int(name.rsplit("_", 1)[1].split(".")[0])
                if split == "val2014" and image_id < 1000:  # a copy: the train photo's bytes and boxes
                    train = os.path.join(out, trainval[image_id]["image"])
                    assert open(path, "rb").read() == open(train, "rb").read()
                    assert boxes.tolist() == trainval[image_id]["boxes"]
                    copies += 1
    assert copies == 11
