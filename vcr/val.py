"""VCR accuracy on val.

    python vcr/val.py --a-cfg CFG --a-ckpt CKPT [--r-cfg CFG --r-ckpt CKPT] [--opts ...]

Q->A accuracy of the answer model, QA->R accuracy of the rationale model and, given both, Q->AR
accuracy (answer and rationale both right).
"""
import _init_paths  # noqa: F401
import argparse

from common.cli import run_main
from vcr.function.test import val_correct
from vcr.task import TASK


NAMES = {"Q2A": "Q->A", "QA2R": "QA->R"}


def main():
    parser = argparse.ArgumentParser("VCR validation accuracy")
    parser.add_argument("--a-cfg", "--cfg", dest="a_cfg", help="config of the answer (Q2A) model")
    parser.add_argument("--a-ckpt", "--ckpt", dest="a_ckpt", help="checkpoint of the answer model")
    parser.add_argument("--r-cfg", help="config of the rationale (QA2R) model")
    parser.add_argument("--r-ckpt", help="checkpoint of the rationale model")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides KEY VALUE ...")
    args = parser.parse_args()
    correct = {}
    for cfg_path, ckpt in ((args.a_cfg, args.a_ckpt), (args.r_cfg, args.r_ckpt)):
        if bool(cfg_path) != bool(ckpt):
            parser.error("each checkpoint needs its config: --a-cfg with --a-ckpt, --r-cfg with --r-ckpt")
        if ckpt:
            cfg = TASK.load_config(cfg_path, args.opts)
            task = cfg.DATASET.TASK
            correct[task] = val_correct(TASK, cfg, ckpt)
            print("{} accuracy on val: {:.4f}".format(NAMES.get(task, task), correct[task].float().mean().item()))
    if not correct:
        parser.error("give --a-cfg/--a-ckpt, --r-cfg/--r-ckpt, or both")
    if set(correct) == {"Q2A", "QA2R"}:
        print("Q->AR accuracy on val: {:.4f}".format((correct["Q2A"] & correct["QA2R"]).float().mean().item()))


if __name__ == "__main__":
    run_main(main)
