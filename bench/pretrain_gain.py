"""Does the demo pretraining help fine-tuning? VCR demo accuracy from the pretraining checkpoint vs from the
plain language-model initialisation, same steps and seeds.

1. Pretrains ``cfgs/pretrain/demo_e2e_cpu.yaml`` (demo captions + demo corpus, the VCR demo's model) through
   ``pretrain/train_end2end.py`` for ``--pretrain-epochs`` epochs, on the demo photographs and
   ``--pretrain-scenes`` generated scenes (``demo/make_demo_captions.py`` into the output folder).
2. For each seed, fine-tunes ``cfgs/vcr/demo_q2a_cpu.yaml`` through ``vcr/train_end2end.py`` twice: from
   MiniLM + random ResNet-18 (the demo as it ships), and from the pretraining checkpoint
   (``NETWORK.PARTIAL_PRETRAIN``, prefix change ``vlbert->vlbert._module``). Both runs see the same items
   in the same order (``RNG_SEED``), the same number of optimizer steps, one process accumulating 4
   micro-batches of 2 (8 images per step, as the demo's 2 processes x 2 x 2).
3. Reads each run's validation accuracy after every epoch (``Val-Acc`` in its log, on ``--val-items``
   learnable validation items) and the wall time from the run's first log line to that validation.

Prints one line per run and a summary per arm: final accuracy (mean over seeds) and time to 80% (the
first validation at or above 0.8; '-' when never reached).

Usage: python bench/pretrain_gain.py [--seeds 1 2 3] [--epochs 5] [--train-items 480] [--val-items 200]
                                     [--pretrain-epochs 3] [--pretrain-scenes 400] [--out output/bench_pretrain_gain]
Needs data/demo (demo/make_demo_data.py) and model/pretrained_model/all-MiniLM-L6-v2 (``scripts/run_demo.sh``
writes both); writes the demo corpus (demo/make_demo_corpus.py) when it is missing.
"""
import argparse
import datetime
import glob
import itertools
import json
import os
import re
import subprocess
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRETRAIN_CFG = "cfgs/pretrain/demo_e2e_cpu.yaml"
VCR_CFG = "cfgs/vcr/demo_q2a_cpu.yaml"
VCR_DATA = os.path.join("data", "demo")
PREFIX_CHANGES = '["vlbert->vlbert._module"]'
TARGET = 0.8
_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def run(cmd, log_path):
    """Run ``cmd`` in the repository with its output in ``log_path``; on failure, exit naming the log."""
    print("$", " ".join(cmd), flush=True)
    with open(log_path, "w") as log:
        code = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              env=dict(os.environ, CUDA_VISIBLE_DEVICES="")).returncode
    if code != 0:
        sys.exit("failed with exit code {}; its output is in {}".format(code, log_path))


def last_checkpoint(folder):
    """The highest-epoch ``*-NNNN.model`` under ``folder``; FileNotFoundError if none."""
    found = glob.glob(os.path.join(folder, "**", "*-[0-9][0-9][0-9][0-9].model"), recursive=True)
    if not found:
        raise FileNotFoundError("no checkpoint under {}".format(folder))
    return max(found, key=lambda p: int(re.search(r"-(\d{4})\.model$", p).group(1)))


def validations(log_path):
    """``[(epoch, accuracy, seconds since the log's first line), ...]`` from a training log."""
    start, out = None, []
    with open(log_path) as f:
        for line in f:
            m = _TIME.match(line)
            if not m:
                continue
            t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            start = start or t
            v = re.search(r"Epoch\[(\d+)\] \tVal-Acc=([0-9.]+)", line)
            if v:
                out.append((int(v.group(1)), float(v.group(2)), (t - start).total_seconds()))
    return out


def subset(name, source, count):
    """``data/demo/<name>``: the first ``count`` lines of ``data/demo/<source>``; returns ``name``."""
    with open(os.path.join(REPO, VCR_DATA, source)) as f:
        lines = list(itertools.islice(f, count))
    with open(os.path.join(REPO, VCR_DATA, name), "w") as f:
        f.writelines(lines)
    return name


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--epochs", type=int, default=5, help="fine-tuning epochs (default: %(default)s)")
    parser.add_argument("--train-items", type=int, default=480, help="first N items of train.jsonl")
    parser.add_argument("--val-items", type=int, default=200, help="first N items of val_shapes.jsonl")
    parser.add_argument("--pretrain-epochs", type=int, default=3)
    parser.add_argument("--pretrain-scenes", type=int, default=400, help="generated scenes to pretrain on")
    parser.add_argument("--out", default=os.path.join("output", "bench_pretrain_gain"))
    args = parser.parse_args()
    out = os.path.join(REPO, args.out)
    os.makedirs(out, exist_ok=True)

    pretrain_dir = os.path.join(out, "pretrain")
    os.makedirs(pretrain_dir, exist_ok=True)
    captions = os.path.join(out, "conceptual-captions")
    if not os.path.isfile(os.path.join(captions, "val_frcnn.json")):
        run([sys.executable, "demo/make_demo_captions.py", "--out", captions, "--train", str(args.pretrain_scenes),
             "--val", "8"], os.path.join(out, "captions.log"))
    with open(os.path.join(REPO, PRETRAIN_CFG)) as f:
        datasets = yaml.safe_load(f)["DATASET"]
    corpus = datasets[1]["TRAIN_ANNOTATION_FILE"]
    if not os.path.isfile(os.path.join(REPO, corpus)):
        run([sys.executable, "demo/make_demo_corpus.py", "--out", corpus], os.path.join(out, "corpus.log"))
    datasets[0]["DATASET_PATH"] = captions
    run([sys.executable, "pretrain/train_end2end.py", "--cfg", PRETRAIN_CFG, "--model-dir", pretrain_dir,
         "--opts", "TRAIN.END_EPOCH", str(args.pretrain_epochs), "DATASET", json.dumps(datasets)],
        os.path.join(pretrain_dir, "run.log"))
    pretrained = last_checkpoint(pretrain_dir)

    data_opts = ["DATASET.TRAIN_ANNOTATION_FILE", subset("train_bench.jsonl", "train.jsonl", args.train_items),
                 "DATASET.VAL_ANNOTATION_FILE", subset("val_bench.jsonl", "val_shapes.jsonl", args.val_items),
                 "TRAIN.END_EPOCH", str(args.epochs), "TRAIN.GRAD_ACCUMULATE_STEPS", "4"]
    arms = {"language model": [],
            "demo pretraining": ["NETWORK.PARTIAL_PRETRAIN", pretrained,
                                 "NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES", PREFIX_CHANGES]}
    results = {arm: [] for arm in arms}
    for seed in args.seeds:
        for arm, arm_opts in arms.items():
            model_dir = os.path.join(out, "{}-seed{}".format(arm.replace(" ", "_"), seed))
            if os.path.exists(model_dir):
                raise FileExistsError("{} exists: a fresh --out is needed (AUTO_RESUME would pick it up)"
                                      .format(model_dir))
            os.makedirs(model_dir)
            log = os.path.join(model_dir, "run.log")
            run([sys.executable, "vcr/train_end2end.py", "--cfg", VCR_CFG, "--model-dir", model_dir, "--opts",
                 "RNG_SEED", str(seed)] + data_opts + arm_opts, log)
            vals = validations(log)
            reached = next((t for _, acc, t in vals if acc >= TARGET), None)
            results[arm].append((vals[-1][1], reached))
            print("{:<17} seed {}: Val-Acc per epoch {}, time to {:.0%}: {}".format(
                arm, seed, [round(acc, 3) for _, acc, _ in vals], TARGET,
                "-" if reached is None else "{:.0f} s".format(reached)), flush=True)

    print("\nVCR demo fine-tuning, {} epochs on {} items, {} seeds:".format(args.epochs, args.train_items,
                                                                          len(args.seeds)))
    for arm, runs in results.items():
        finals = [acc for acc, _ in runs]
        times = [t for _, t in runs if t is not None]
        print("  from {:<17} final Val-Acc mean {:.3f} (runs {}); reached {:.0%} in {}/{} runs{}".format(
            arm, sum(finals) / len(finals), [round(a, 3) for a in finals], TARGET, len(times), len(runs),
            ", mean {:.0f} s".format(sum(times) / len(times)) if times else ""))


if __name__ == "__main__":
    main()
