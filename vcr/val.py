"""Accuracy of a VCR checkpoint on val: ``python vcr/val.py --cfg CFG --ckpt CKPT [--opts ...]``.

Q->A or QA->R accuracy by the config's DATASET.TASK; with ``--r-cfg/--r-ckpt`` as well, the Q->AR
accuracy (answer and rationale both right) of the pair.
"""
import _init_paths  # noqa: F401
import argparse

from common.cli import run_main
from vcr.function.config import load_config
from vcr.function.test import val_net


def main():
    parser = argparse.ArgumentParser("VCR validation accuracy")
    parser.add_argument("--cfg", required=True, help="config of the checkpoint")
    parser.add_argument("--ckpt", required=True, help="checkpoint file (.model)")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides KEY VALUE ...")
    args = parser.parse_args()
    cfg = load_config(args.cfg, args.opts)
    values = val_net(cfg, args.ckpt)
    name = {"Q2A": "Q->A", "QA2R": "QA->R"}.get(cfg.DATASET.TASK, cfg.DATASET.TASK)
    print("{} accuracy on val: {:.4f}".format(name, values["Acc"]))


if __name__ == "__main__":
    run_main(main)
