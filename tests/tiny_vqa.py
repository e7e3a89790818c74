"""Tiny VQA v2 runs through the real entry points (``vqa/train_end2end.py``, ``vqa/test.py``,
``vqa/val.py``) on the shipped configs, for the tests.

Inputs (:func:`make_inputs`): a ``data/coco`` folder in the reference layout with train2014 (8
questions), val2014 (3) and test2015 (5) questions on 4 images, per-image feature JSON files of
random 2048-d features (``DATASET.BOXES: '10-100ada'`` folders, 2 to 4 boxes per image), a 7-answer
vocabulary, and a random 2-layer BERT of 32 units (``tests/tiny_vcr.py``). :data:`TINY_OPTS` shrink
the paper configs: no partial pretrain, 32-unit VL-BERT, batches of 2, one epoch.
"""
import json
import os

import numpy as np

from common.data.region_features import RegionFeatures, write_feature_json
from tests.tiny_vcr import HIDDEN, SPECIAL_TOKENS, _bert_folder, run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFGS = {name: os.path.join(ROOT, "cfgs", "vqa", name + ".yaml") for name in ("base_4x16G_fp32", "large_4x16G_fp32")}
ANSWERS = ["<unk>", "2", "3", "red", "blue", "yes", "no"]
# image_id -> (COCO folder, number of boxes)
IMAGES = {1: ("train2014", 3), 2: ("train2014", 2), 3: ("val2014", 4), 4: ("test2015", 3)}
QUESTIONS = {  # split -> [(question_id, image_id, question, ten answers or None)]
    "train2014": [(10 + i, 1 + i % 2, q, a) for i, (q, a) in enumerate([
        ("what color is it?", ["red"] * 8 + ["blue"] * 2), ("how many dogs?", ["2"] * 3 + ["two"] * 3 + ["3"] * 4),
        ("is it red?", ["yes"] * 10), ("what color is the sky?", ["blue"] * 10),
        ("how many cats?", ["3"] * 10), ("is it blue?", ["no"] * 9 + ["yes"]),
        ("what is it?", ["zebra"] * 10), ("how many?", ["2"] * 10)])],
    "val2014": [(30, 3, "what color is it?", ["red"] * 10), (31, 3, "how many dogs?", ["2"] * 5 + ["3"] * 5),
                (32, 3, "what is it?", ["zebra"] * 10)],
    "test2015": [(40 + i, 4, q, None) for i, q in enumerate(
        ["what color?", "how many?", "is it red?", "what is it?", "how many dogs?"])],
}
FEATURE_FOLDERS = {"train2014": "trainval2014_resnet101_faster_rcnn_genome",
                   "val2014": "trainval2014_resnet101_faster_rcnn_genome",
                   "test2015": "test2015_resnet101_faster_rcnn_genome"}

TINY_OPTS = {
    "NUM_WORKERS_PER_GPU": 0, "LOG_FREQUENT": 1, "NETWORK.PARTIAL_PRETRAIN": "",
    "NETWORK.IMAGE_FINAL_DIM": HIDDEN, "NETWORK.VLBERT.hidden_size": HIDDEN, "NETWORK.VLBERT.visual_size": HIDDEN,
    "NETWORK.VLBERT.num_hidden_layers": 2, "NETWORK.VLBERT.num_attention_heads": 2,
    "NETWORK.VLBERT.intermediate_size": 64, "NETWORK.VLBERT.max_position_embeddings": 128,
    "DATASET.ANSWER_VOCAB_SIZE": len(ANSWERS), "TRAIN.BATCH_IMAGES": 2, "VAL.BATCH_IMAGES": 2,
    "TEST.BATCH_IMAGES": 2, "TRAIN.END_EPOCH": 1, "TRAIN.WARMUP_STEPS": 2, "TRAIN.LR": 1e-4,
}


class Inputs:
    """Paths of the tiny inputs under ``root`` and the ``--opts`` of a tiny run."""

    def __init__(self, root):
        self.root = str(root)
        self.coco = os.path.join(self.root, "coco")
        self.bert = os.path.join(self.root, "bert")
        self.vocab = SPECIAL_TOKENS + sorted({w for qs in QUESTIONS.values() for q in qs
                                              for w in q[2].replace("?", " ?").split()} | {"2", "3", "red", "blue",
                                                                                           "yes", "no"})

    def opts(self, **changes):
        """``--opts`` list: :data:`TINY_OPTS` for these inputs, then ``changes`` (``TRAIN__LR=0``)."""
        values = dict(TINY_OPTS, **{"DATASET.DATASET_PATH": self.coco, "NETWORK.BERT_MODEL_NAME": self.bert,
                                    "DATASET.ANSWER_VOCAB_FILE": os.path.join(self.coco, "vqa", "answers_vqa.txt"),
                                    "NETWORK.VLBERT.vocab_size": len(self.vocab)})
        values.update({k.replace("__", "."): v for k, v in changes.items()})
        out = []
        for key, value in values.items():
            out += [key, value if isinstance(value, str) else json.dumps(value)]
        return out

    def annotation_file(self, split):
        return os.path.join(self.coco, "vqa", "v2_mscoco_{}_annotations.json".format(split))

    def question_file(self, split):
        return os.path.join(self.coco, "vqa", "v2_OpenEnded_mscoco_{}_questions.json".format(split))


def make_inputs(root):
    """Write the tiny data and BERT under ``root``; returns :class:`Inputs`."""
    inputs = Inputs(root)
    os.makedirs(os.path.join(inputs.coco, "vqa"))
    for split, qs in QUESTIONS.items():
        with open(inputs.question_file(split), "w") as f:
            json.dump({"questions": [{"question_id": q, "image_id": i, "question": t} for q, i, t, _ in qs]}, f)
        if split != "test2015":
            with open(inputs.annotation_file(split), "w") as f:
                json.dump({"annotations": [
                    {"question_id": q, "image_id": i, "question_type": t.split()[0],
                     "answer_type": "number" if t.startswith("how") else "yes/no" if t.startswith("is") else "other",
                     "multiple_choice_answer": a[0], "answers": [{"answer": x, "answer_id": k + 1}
                                                                 for k, x in enumerate(a)]}
                    for q, i, t, a in qs]}, f)
    with open(os.path.join(inputs.coco, "vqa", "answers_vqa.txt"), "w") as f:
        f.write("\n".join(ANSWERS) + "\n")
    rng = np.random.default_rng(0)
    for image_id, (split, n) in IMAGES.items():
        folder = os.path.join(inputs.coco, "vgbua_res101_precomputed", FEATURE_FOLDERS[split])
        os.makedirs(folder, exist_ok=True)
        boxes = np.array([[2 * k, k, 20 + 3 * k, 16 + k] for k in range(n)], np.float32)
        write_feature_json(os.path.join(folder, "{}.json".format(image_id)), RegionFeatures(
            image_id, 40, 30, boxes, rng.normal(size=(n, 2048)).astype(np.float32)))
    _bert_folder(inputs.bert, inputs.vocab)
    return inputs


def write_images(inputs):
    """The COCO images of the tiny data (random 40 x 30 pixels, the size the features were written for), for
    runs with an image encoder (NETWORK.IMAGE_FEAT_PRECOMPUTED false)."""
    import torch
    from PIL import Image

    for image_id, (split, _) in IMAGES.items():
        folder = os.path.join(inputs.coco, split)
        os.makedirs(folder, exist_ok=True)
        pixels = torch.randint(0, 256, (30, 40, 3), generator=torch.Generator().manual_seed(image_id))
        Image.fromarray(pixels.to(torch.uint8).numpy()).save(
            os.path.join(folder, "COCO_{}_{:012d}.jpg".format(split, image_id)))


def run_entry(script, argv):
    """``python vqa/<script> argv...`` in this process (:func:`tests.tiny_vcr.run_script`). Returns the exit code."""
    return run_script(os.path.join(ROOT, "vqa", script), argv)


def output_folder(model_dir, cfg_name):
    """Output folder of a training run of ``cfgs/vqa/<cfg_name>.yaml`` (OUTPUT_PATH, TRAIN_IMAGE_SET with + as _)."""
    return os.path.join(str(model_dir), "output", "vl-bert", "vqa", cfg_name, "train2014_val2014_train")
