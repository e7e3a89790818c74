"""VQA demo benchmark: the vision model against a blind and a boxes-only baseline, and the data
loading share of step time, measured in one run on the demo of ``scripts/run_demo.sh vqa``.

Trains ``cfgs/vqa/demo_cpu.yaml`` three times through ``scripts/dist_run_single.sh 2`` (2 processes),
each in a fresh folder:

- vision: the demo model on the region features of ``tools/extract_features.py``;
- blind: ``NETWORK.BLIND true`` (no image: the question alone);
- boxes-only: the same model on a copy of the feature cache whose features are all zero (the boxes'
  positions and count stay; what is inside them is gone).

For each: the training wall time (process start to exit), the time at which the per-epoch
validation (``Val-SoftAcc`` on val2014) first reached ``--target`` (elapsed since the first log line),
the official accuracy (``vqa/val.py``) of the last checkpoint on val2014 and on its learnable part
(the shapes questions), and the data-loading share of step time (the ``Data`` column of the
Speedometer lines over the sum of all six columns: data, transfer, forward, backward, optimizer, metrics).

Usage: python bench/vqa_demo.py [--target 0.7] [--models vision blind boxes-only] [--out output/bench_vqa_demo]
       [--opts KEY VALUE ...]
Needs data/demo_vqa with its features (``scripts/run_demo.sh vqa`` writes them).
"""
import argparse
import datetime
import glob
import json
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
CFG = "cfgs/vqa/demo_cpu.yaml"
DATA = os.path.join(REPO, "data", "demo_vqa")
FEATURES = "vgbua_res101_precomputed"
TIME_FORMAT = "%Y-%m-%d %H:%M:%S,%f"


def zeroed_copy(data, out):
    """A data folder sharing ``data``'s question files, with feature caches of all-zero features."""
    import numpy as np
    from common.data.feature_cache import FeatureCache, write_feature_cache
    from common.data.region_features import RegionFeatures

    os.makedirs(os.path.join(out, FEATURES))
    os.symlink(os.path.join(data, "vqa"), os.path.join(out, "vqa"))
    for cache_dir in glob.glob(os.path.join(data, FEATURES, "*.cache")):
        cache = FeatureCache(cache_dir)

        def zeroed(cache=cache):
            for image_id in cache.ids:
                r = cache[image_id]
                yield RegionFeatures(r.image_id, r.image_w, r.image_h, r.boxes, np.zeros_like(r.features),
                                     None if r.image_box_feature is None else np.zeros_like(r.image_box_feature))
        write_feature_cache(zeroed(), os.path.join(out, FEATURES, os.path.basename(cache_dir)))
    return out


def train(model_dir, opts):
    """2-process training; returns (wall seconds, log text)."""
    os.makedirs(model_dir)
    cmd = ["./scripts/dist_run_single.sh", "2", "vqa/train_end2end.py", CFG, model_dir, "--opts"] + opts
    print("$", " ".join(cmd), flush=True)
    start = time.time()
    out = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(os.path.join(model_dir, "train.log"), "w") as f:
        f.write(out.stdout)
    if out.returncode:
        raise RuntimeError("training failed:\n" + out.stdout[-3000:])
    return time.time() - start, out.stdout


def time_to_target(log, target):
    """Seconds from the first log line to the first ``Val-SoftAcc >= target`` line, or None."""
    stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) ", log, re.M)
    if not stamps:
        return None
    start = datetime.datetime.strptime(stamps[0], TIME_FORMAT)
    for stamp, acc in re.findall(r"^(\S+ \S+) .*Val-SoftAcc=([0-9.]+)", log, re.M):
        if float(acc) >= target:
            return (datetime.datetime.strptime(stamp, TIME_FORMAT) - start).total_seconds()
    return None


def loading_share(log):
    """Data time over step time, summed over the Speedometer lines of the log."""
    rows = [[float(x) for x in m] for m in re.findall(
        r"Data: ([0-9.]+) Tran: ([0-9.]+) F: ([0-9.]+) B: ([0-9.]+) O: ([0-9.]+) M: ([0-9.]+)", log)]
    total = sum(sum(r) for r in rows)
    return sum(r[0] for r in rows) / total if total else float("nan")


def accuracies(ckpt, opts, folder):
    """(official accuracy on val2014, on its shapes questions), percent, from vqa/val.py's answers."""
    from vqa.data.vqa_files import load_annotations
    from vqa.function.evaluation import evaluate

    cmd = [sys.executable, "vqa/val.py", "--cfg", CFG, "--ckpt", ckpt, "--result-path", folder,
           "--result-name", "val", "--opts"] + opts
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    overall = float(re.search(r"Overall Accuracy is: ([0-9.]+)", out).group(1))
    with open(os.path.join(folder, "val_vqa2_val2014.json")) as f:
        answers = {r["question_id"]: r["answer"] for r in json.load(f)}
    shapes = load_annotations(os.path.join(DATA, "vqa", "v2_mscoco_val2014_shapes_annotations.json"))
    return overall, evaluate(shapes, answers)["overall"]


def last_checkpoint(model_dir):
    found = glob.glob(os.path.join(model_dir, "**", "*-[0-9][0-9][0-9][0-9].model"), recursive=True)
    return max(found, key=lambda p: int(re.search(r"-(\d{4})\.model$", p).group(1)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=float, default=0.7, help="Val-SoftAcc the time to accuracy is measured to")
    parser.add_argument("--out", default=os.path.join("output", "bench_vqa_demo"), help="parent of the run folders")
    parser.add_argument("--models", nargs="+", choices=("vision", "blind", "boxes-only"),
                        default=["vision", "blind", "boxes-only"], help="which of the three to train")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="extra overrides for every run")
    args = parser.parse_args()
    if not glob.glob(os.path.join(DATA, FEATURES, "*.cache")):
        sys.exit("error: no feature cache under {}: run scripts/run_demo.sh vqa first".format(DATA))
    root = os.path.abspath(os.path.join(args.out, time.strftime("%Y%m%d-%H%M%S")))
    runs = [("vision", []), ("blind", ["NETWORK.BLIND", "true"])]
    if "boxes-only" in args.models:
        runs.append(("boxes-only", ["DATASET.DATASET_PATH", zeroed_copy(DATA, os.path.join(root, "data_zeroed"))]))
    runs = [(name, extra) for name, extra in runs if name in args.models]
    print("{:10s} {:>8s} {:>10s} {:>12s} {:>11s} {:>9s}".format(
        "model", "train s", "to target", "val2014 %", "shapes %", "loading"), flush=True)
    for name, extra in runs:
        opts = args.opts + extra
        model_dir = os.path.join(root, name)
        seconds, log = train(model_dir, opts)
        reached = time_to_target(log, args.target)
        overall, shapes = accuracies(last_checkpoint(model_dir), opts, model_dir)
        print("{:10s} {:8.0f} {:>10s} {:12.2f} {:11.2f} {:8.1f}%".format(
            name, seconds, "never" if reached is None else "{:.0f} s".format(reached), overall, shapes,
            100 * loading_share(log)), flush=True)
    print("target: Val-SoftAcc {}; logs: {}".format(args.target, root))


if __name__ == "__main__":
    main()
