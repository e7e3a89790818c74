"""RefCOCO+ demo: val accuracy of the model against a blind baseline and against box-only rules.

Trains ``cfgs/refcoco/demo_cpu.yaml`` through ``scripts/dist_run_single.sh 2`` (2 CPU processes, gloo), then
the same with ``NETWORK.BLIND true`` (every pixel at the mean colour: the model keeps the words and the boxes'
geometry, not what the boxes show), and measures each last checkpoint on the val split with
``refcoco/val.py``. The box-only baselines need no training: each picks a candidate (the same candidates as
the model: the whole image and the ground-truth boxes) from the boxes alone, by a fixed rule (first in the
candidate order, largest, smallest, leftmost, rightmost), or uniformly at random (its expected accuracy); the
best rule is reported.

The demo's expressions name a colour ("the green shape", "the red shape on the left"): the boxes and the words
without the pixels do not say which shape is meant, so the model should beat both baselines by far.

Usage: python bench/refcoco_demo_baselines.py [--data data/demo_refcoco] [--out output/bench_refcoco_demo]
                                              [--opts KEY VALUE ...]
Needs the demo data (demo/make_refcoco_demo_data.py) and model/pretrained_model/all-MiniLM-L6-v2
(scripts/run_demo.sh links it). A finished run in ``--out`` is reused (TRAIN.AUTO_RESUME).
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
CFG = "cfgs/refcoco/demo_cpu.yaml"


def last_checkpoint(model_dir):
    """Path of the highest-epoch ``*-NNNN.model`` under model_dir; FileNotFoundError if none."""
    found = glob.glob(os.path.join(model_dir, "**", "*-[0-9][0-9][0-9][0-9].model"), recursive=True)
    if not found:
        raise FileNotFoundError("no checkpoint written under {}".format(model_dir))
    return max(found, key=lambda p: int(re.search(r"-(\d{4})\.model$", p).group(1)))


def train(model_dir, opts):
    """Run the 2-process training (a no-op when ``model_dir`` holds the finished run); returns wall seconds."""
    os.makedirs(model_dir, exist_ok=True)
    cmd = ["./scripts/dist_run_single.sh", "2", "refcoco/train_end2end.py", CFG, model_dir, "--opts"] + opts
    print("$", " ".join(cmd), flush=True)
    start = time.time()
    with open(os.path.join(model_dir, "train.log"), "a") as log:
        subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
    return time.time() - start


def val_accuracy(ckpt, opts):
    """(accuracy, correct, expressions) printed by refcoco/val.py for ``ckpt`` on the val split."""
    cmd = [sys.executable, "refcoco/val.py", "--cfg", CFG, "--ckpt", ckpt, "--opts"] + opts
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    found = re.search(r"RefCOCO\+ accuracy on val: ([0-9.]+) \((\d+) of (\d+) expressions\)", out)
    return float(found.group(1)), int(found.group(2)), int(found.group(3))


RULES = {
    "first candidate": lambda boxes: 0,
    "largest box": lambda boxes: int(((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).argmax()),
    "smallest box": lambda boxes: int(((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).argmin()),
    "leftmost box": lambda boxes: int((boxes[:, 0] + boxes[:, 2]).argmin()),
    "rightmost box": lambda boxes: int((boxes[:, 0] + boxes[:, 2]).argmax()),
}


def box_only_accuracies(data, opts):
    """Accuracy on val of each rule of :data:`RULES` and of a uniform random choice (expected value), on the
    candidates the model sees (``ADD_IMAGE_AS_A_BOX``: the whole image first)."""
    from refcoco.data import RefCOCO
    from refcoco.task import TASK
    from refcoco.metrics import box_iou

    cfg = TASK.load_config(os.path.join(REPO, CFG), opts)
    dataset = RefCOCO(cfg.DATASET.VAL_IMAGE_SET, data, tokenizer=None, boxes=cfg.DATASET.VAL_BOXES,
                      add_image_as_a_box=cfg.DATASET.ADD_IMAGE_AS_A_BOX)
    hits = {name: 0 for name in RULES}
    random_hits = 0.0
    for index, item in enumerate(dataset.items):
        boxes = dataset.candidate_boxes(index)
        if dataset.add_image_as_a_box:
            boxes = torch.cat([torch.tensor([[0.0, 0.0, item["width"] - 1.0, item["height"] - 1.0]]), boxes])
        right = box_iou(boxes, dataset.referred_boxes[index][None]).squeeze(1) >= 0.5
        for name, rule in RULES.items():
            hits[name] += int(right[rule(boxes)])
        random_hits += right.float().mean().item()
    n = len(dataset)
    accuracies = {name: h / n for name, h in hits.items()}
    accuracies["uniform random"] = random_hits / n
    return accuracies, n


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.path.join("data", "demo_refcoco"), help="DATASET.DATASET_PATH")
    parser.add_argument("--out", default=os.path.join("output", "bench_refcoco_demo"), help="parent of the runs")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="extra overrides for both runs")
    args = parser.parse_args()
    data, root = os.path.abspath(args.data), os.path.abspath(args.out)
    opts = ["DATASET.DATASET_PATH", data] + args.opts

    results = {}
    for name, extra in (("model", []), ("blind", ["NETWORK.BLIND", "true"])):
        folder = os.path.join(root, name)
        reused = bool(glob.glob(os.path.join(folder, "**", "*.model"), recursive=True))
        seconds = train(folder, opts + extra)
        acc, correct, total = val_accuracy(last_checkpoint(folder), opts + extra)
        results[name] = acc
        print("{:14s} val accuracy {:.4f} ({} of {} expressions); {}".format(
            name, acc, correct, total, "resumed an earlier run (see its train.log)" if reused else
            "training wall time {:.0f} s".format(seconds)), flush=True)
    rules, n = box_only_accuracies(data, opts)
    for name, acc in rules.items():
        print("box-only rule  {:15s} val accuracy {:.4f} ({} expressions)".format(name, acc, n))
    best_rule = max(rules, key=rules.get)
    print("model {:.4f} | blind {:.4f} | best box-only rule ({}) {:.4f}".format(
        results["model"], results["blind"], best_rule, rules[best_rule]))
    print("logs:", root)


if __name__ == "__main__":
    main()
