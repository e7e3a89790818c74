"""The VQA-format demo data set (``python demo/make_vqa_demo_data.py``), in the reference's
``data/coco`` layout (see data/PREPARE_DATA.md), deterministic.

Two parts:

- real: the 11 ``skimage.data`` photographs and boxes of the VCR demo with their hand-written
  questions, the object references spelt out (``[0]`` -> ``the clock``) and the right answer given
  by all 10 annotators; question k of a photograph goes to train2014, val2014 or test2015 (k mod 3).
- shapes (learnable): 96x96 scenes of four shapes (one of each kind) in colours drawn with repeats.
  Questions ask ``what color is the leftmost shape ?`` (and right-, top-, bottommost) or ``how many
  red shapes are there ?``: every box has the same size, so the boxes alone tell where each shape is
  but neither question can be answered without the pixels inside them. 8 of the 10 annotators
  give the right answer, 2 another colour or count (soft score 1.0 for the right one).

Written under ``--out`` (default data/demo_vqa):

    vqa/v2_OpenEnded_mscoco_{train2014,val2014,test2015}_questions.json
    vqa/v2_mscoco_{train2014,val2014}_annotations.json
    vqa/v2_mscoco_val2014_shapes_annotations.json   the learnable part of val (its accuracy)
    vqa/answers_vqa.txt        <unk> and every answer of the training questions
    train2014/, val2014/, test2015/   COCO_<split>_<image_id:012d>.jpg
    boxes_trainval.json, boxes_test2015.json   image and boxes lists for tools/extract_features.py
    boxes_val2014.json         the boxes of the val2014 photographs, which are byte-identical copies of train2014
                               ones (one image id, one feature file): not extracted, read by the predictor

Region features are not written here: ``scripts/run_demo.sh vqa`` extracts them with
``tools/extract_features.py`` into ``vgbua_res101_precomputed/`` (DATASET.BOXES '36' folders).
"""
import argparse
import json
import os
import re

import numpy as np

from make_demo_data import COLORS, REAL, SCENE_SIZE, make_scene, real_image

SPLITS = ("train2014", "val2014", "test2015")
EXTREMES = {"leftmost": ("cx", -1), "rightmost": ("cx", 1), "topmost": ("cy", -1), "bottommost": ("cy", 1)}
COUNTS = [str(n) for n in range(5)]
ANNOTATORS, RIGHT_ANNOTATORS = 10, 8
# Image ids: photographs from 1, scenes from 1000 (one id space; COCO's ids are unique across splits).
FIRST_SCENE_ID = 1000


def shapes_question(objects, kind, rng):
    """(question, right answer, wrong answers to draw from, answer type) of one scene."""
    if kind == "count":
        color = str(rng.choice(list(COLORS)))
        n = sum(o["color"] == color for o in objects)
        return "how many {} shapes are there ?".format(color), str(n), [c for c in COUNTS if c != str(n)], "number"
    key, sign = EXTREMES[kind]
    target = max(objects, key=lambda o: sign * o[key])
    return ("what color is the {} shape ?".format(kind), target["color"],
            [c for c in COLORS if c != target["color"]], "other")


def annotation(qid, image_id, question, right, wrong, answer_type, rng, noisy=True):
    """An official-format annotation with 10 answers, of which 2 (``noisy``) are drawn from ``wrong``."""
    answers = [right] * ANNOTATORS
    if noisy:
        for k in rng.choice(ANNOTATORS, ANNOTATORS - RIGHT_ANNOTATORS, replace=False):
            answers[k] = str(rng.choice(wrong))
    return {"question_id": qid, "image_id": image_id, "question_type": " ".join(question.split()[:2]),
            "answer_type": answer_type, "multiple_choice_answer": right,
            "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": k + 1} for k, a in enumerate(answers)]}


def image_path(out, split, image_id):
    coco = "test2015" if split == "test2015" else split
    return os.path.join(out, coco, "COCO_{}_{:012d}.jpg".format(coco, image_id))


def spell_out(text, objects):
    """``"Why is [0] blurry ?"`` -> ``"why is the clock blurry ?"`` (the VQA text has no box tags)."""
    return re.sub(r"\[(\d+)\]", lambda m: "the " + objects[int(m.group(1))], text).lower()


def write_real(out, records, boxes):
    """Photographs, their questions (all 10 annotators right) and their box lists (``boxes``: trainval, test2015,
    the val2014 copies)."""
    for image_id, (loader, objects, obj_boxes, items) in enumerate(REAL.values(), start=1):
        image = real_image(loader)
        for k, (question, answers, _) in enumerate(items):
            split = SPLITS[k % len(SPLITS)]
            path = image_path(out, split, image_id)
            image.save(path, quality=92)
            # train2014 and val2014 share one feature folder (and the image id): a val2014 copy is listed apart
            part = {"train2014": 0, "test2015": 1, "val2014": 2}[split]
            boxes[part].append({"image_id": image_id, "image": os.path.relpath(path, out), "boxes": obj_boxes})
            right = spell_out(answers[0], objects).rstrip(" .")
            qid = image_id * 100 + k
            records[split].append(({"question_id": qid, "image_id": image_id,
                                    "question": spell_out(question, objects)},
                                   annotation(qid, image_id, spell_out(question, objects), right, [], "other",
                                              None, noisy=False)))


def write_shapes(out, split, num_questions, first_id, rng, records, boxes):
    """Scenes (2 questions each: a colour and a count question) of one split; returns the next image id."""
    image_id = first_id
    while len([r for r in records[split] if r[0]["image_id"] >= FIRST_SCENE_ID]) < num_questions:
        image, objects = make_scene(rng, colors=[str(c) for c in rng.choice(list(COLORS), 4)])
        path = image_path(out, split, image_id)
        image.save(path, quality=95)
        boxes[split == "test2015"].append({"image_id": image_id, "image": os.path.relpath(path, out),
                                           "boxes": [o["box"] for o in objects]})
        for kind in (str(rng.choice(list(EXTREMES))), "count"):
            question, right, wrong, answer_type = shapes_question(objects, kind, rng)
            qid = image_id * 10 + len(records[split]) % 10
            records[split].append(({"question_id": qid, "image_id": image_id, "question": question},
                                   annotation(qid, image_id, question, right, wrong, answer_type, rng)))
        image_id += 1
    return image_id


def _dump(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def make_vqa_demo_data(out, seed=0, sizes=(1000, 200, 60)):
    """Write the VQA demo under ``out``; returns ``{split: number of questions}``."""
    rng = np.random.RandomState(seed)
    for folder in ("vqa",) + SPLITS:
        os.makedirs(os.path.join(out, folder), exist_ok=True)
    records = {split: [] for split in SPLITS}
    boxes = ([], [], [])  # train2014 + val2014 images, test2015 images, the val2014 copies of train2014 photos
    write_real(out, records, boxes)
    image_id = FIRST_SCENE_ID
    for split, n in zip(SPLITS, sizes):
        image_id = write_shapes(out, split, n, image_id, rng, records, boxes)
    for split, items in records.items():
        _dump(os.path.join(out, "vqa", "v2_OpenEnded_mscoco_{}_questions.json".format(split)),
              {"questions": [q for q, _ in items], "data_subtype": split})
        if split != "test2015":
            _dump(os.path.join(out, "vqa", "v2_mscoco_{}_annotations.json".format(split)),
                  {"annotations": [a for _, a in items], "data_subtype": split})
    shapes_val = [(q, a) for q, a in records["val2014"] if q["image_id"] >= FIRST_SCENE_ID]
    _dump(os.path.join(out, "vqa", "v2_OpenEnded_mscoco_val2014_shapes_questions.json"),
          {"questions": [q for q, _ in shapes_val]})
    _dump(os.path.join(out, "vqa", "v2_mscoco_val2014_shapes_annotations.json"),
          {"annotations": [a for _, a in shapes_val]})
    answers = sorted({a["multiple_choice_answer"] for _, a in records["train2014"]})
    with open(os.path.join(out, "vqa", "answers_vqa.txt"), "w") as f:
        f.write("\n".join(["<unk>"] + answers) + "\n")
    _dump(os.path.join(out, "boxes_trainval.json"), boxes[0])
    _dump(os.path.join(out, "boxes_test2015.json"), boxes[1])
    _dump(os.path.join(out, "boxes_val2014.json"), boxes[2])
    return {split: len(items) for split, items in records.items()}


assert SCENE_SIZE == 96  # the boxes above are in pixels of these scenes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="data/demo_vqa", help="output folder (default data/demo_vqa)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=1000, help="learnable training questions (default 1000)")
    parser.add_argument("--val", type=int, default=200, help="learnable validation questions (default 200)")
    parser.add_argument("--test", type=int, default=60, help="learnable test questions (default 60)")
    args = parser.parse_args()
    for split, n in make_vqa_demo_data(args.out, args.seed, (args.train, args.val, args.test)).items():
        print("{:10s} {:5d} questions".format(split, n))
    print("VQA demo data written to {}".format(args.out))


if __name__ == "__main__":
    main()
