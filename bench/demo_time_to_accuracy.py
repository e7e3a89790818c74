"""Time to accuracy of the CPU demo (issue 6, "Done when"), vision model vs its blind baseline.

Trains ``cfgs/vcr/demo_q2a_cpu.yaml`` through ``scripts/dist_run_single.sh 2`` (2 CPU processes,
gloo) in a fresh model folder, then measures the Q->A accuracy of its last checkpoint on the
learnable validation items (``data/demo/val_shapes.jsonl``) with ``vcr/val.py``; then the same with
``NETWORK.BLIND true`` (no image: a text-only model, expected near chance, 25%). Prints both
accuracies, their ratio and the training wall times (process start to exit, start-up and the
per-epoch validation included); from each run's log its Val-Acc per epoch (the full validation set of the
config), the time from the training loop's start to Val-Acc >= 0.8 and the seconds per optimizer step
(``bench/run_log.py``); with the machine's state at the start and at the end (load average, CPU
model, cores, torch threads: ``bench/machine.py``), so an idle figure can be told from a busy one.

Target: vision >= 80% within 10 minutes of training, blind < 35%.

Usage: python bench/demo_time_to_accuracy.py [--budget-s 600] [--out output/bench_demo] [--opts KEY VALUE ...]
Needs data/demo (demo/make_demo_data.py) and model/pretrained_model/all-MiniLM-L6-v2.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import time

import torch  # noqa: F401  (for the thread count of the machine state)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench.machine import describe, machine_state  # noqa: E402
from bench.run_log import seconds_per_step, time_to, validations  # noqa: E402

CFG = "cfgs/vcr/demo_q2a_cpu.yaml"
VAL_OPTS = ["DATASET.VAL_ANNOTATION_FILE", "val_shapes.jsonl"]
# The run is stopped only far past the budget; a late finish is reported, not hidden.
HARD_LIMIT_FACTOR = 2.0


def last_checkpoint(model_dir):
    """Path of the highest-epoch ``*-NNNN.model`` under model_dir; FileNotFoundError if none."""
    found = glob.glob(os.path.join(model_dir, "**", "*-[0-9][0-9][0-9][0-9].model"), recursive=True)
    if not found:
        raise FileNotFoundError("no checkpoint written under {}".format(model_dir))
    return max(found, key=lambda p: int(re.search(r"-(\d{4})\.model$", p).group(1)))


def train(model_dir, opts, budget_s):
    """Run the 2-process training; returns (wall seconds, finished before the hard limit)."""
    if os.path.exists(model_dir):
        raise FileExistsError("{} exists: a fresh folder is needed (AUTO_RESUME would pick it up)".format(model_dir))
    os.makedirs(model_dir)
    cmd = ["./scripts/dist_run_single.sh", "2", "vcr/train_end2end.py", CFG, model_dir, "--opts"] + VAL_OPTS + opts
    print("$", " ".join(cmd), flush=True)
    start = time.time()
    with open(os.path.join(model_dir, "train.log"), "w") as log:
        try:
            code = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=budget_s * HARD_LIMIT_FACTOR).returncode
            finished = True
        except subprocess.TimeoutExpired:
            code, finished = 0, False
    if code != 0:
        sys.exit("error: training failed with exit code {}; its output is in {} (data/demo and the MiniLM "
                 "link: run ./scripts/run_demo.sh once)".format(code, log.name))
    return time.time() - start, finished


def log_figures(log):
    """One line of a training log's figures: Val-Acc per epoch (seconds since the first step), the time from
    the first step to Val-Acc >= 0.8 and the seconds per optimizer step (``bench/run_log.py``)."""
    epochs = ", ".join("epoch {} {:.3f} at {}".format(v.epoch, v.metrics.get("Acc", float("nan")),
                                                     "?" if v.seconds is None else "{:.0f} s".format(v.seconds))
                       for v in validations(log))
    reached, per_step = time_to(log, "Acc", 0.8), seconds_per_step(log)
    return "Val-Acc {}; Val-Acc >= 0.8 {} after the first step; {} s per optimizer step".format(
        epochs or "none logged", "never" if reached is None else "{:.0f} s".format(reached),
        "?" if per_step is None else "{:.3f}".format(per_step))


def accuracy(ckpt, opts):
    """Q->A accuracy printed by vcr/val.py for ckpt on val_shapes.jsonl."""
    cmd = [sys.executable, "vcr/val.py", "--cfg", CFG, "--ckpt", ckpt, "--opts"] + VAL_OPTS + opts
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"accuracy on val: ([0-9.]+)", out).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=600.0, help="training wall-clock budget, seconds")
    parser.add_argument("--out", default=os.path.join("output", "bench_demo"), help="parent of the run folders")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="extra overrides for both runs")
    args = parser.parse_args()
    root = os.path.abspath(os.path.join(args.out, time.strftime("%Y%m%d-%H%M%S")))
    start = machine_state()
    print(describe(start, "start"), flush=True)
    # torchrun gives each of its processes OMP_NUM_THREADS=1 when the variable is unset and nproc > 1.
    print("training: 2 processes, torch threads each: {}".format(
        start.omp_num_threads or "1 (torchrun's default, OMP_NUM_THREADS unset)"), flush=True)

    results = {}
    for name, extra in (("vision", []), ("blind", ["NETWORK.BLIND", "true"])):
        opts = args.opts + extra
        seconds, finished = train(os.path.join(root, name), opts, args.budget_s)
        acc = accuracy(last_checkpoint(os.path.join(root, name)), opts)
        results[name] = (acc, seconds, finished)
        print("{:6s}: Q->A accuracy on val_shapes {:.4f}, training wall time {:.0f} s{}".format(
            name, acc, seconds, "" if finished else " (stopped at the hard limit)"), flush=True)
        with open(os.path.join(root, name, "train.log")) as f:
            print("{:6s}: {}".format(name, log_figures(f.read())), flush=True)

    (acc_v, sec_v, done_v), (acc_b, _, _) = results["vision"], results["blind"]
    print("vision / blind accuracy ratio: {:.2f}".format(acc_v / max(acc_b, 1e-9)))
    ok = done_v and sec_v <= args.budget_s and acc_v >= 0.80 and acc_b < 0.35
    print("target (vision >= 0.80 within {:.0f} s, blind < 0.35): {}".format(args.budget_s, "MET" if ok else "NOT MET"))
    print(describe(start, "start"))
    print(describe(machine_state(), "end"))
    print("figures taken on {} machine (1-minute load average {:.2f} at the start; idle: < 0.5)".format(
        "an idle" if start.idle else "a BUSY", start.load[0]))
    print("logs:", root)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
