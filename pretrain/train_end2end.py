"""Pretrain VL-BERT: ``python pretrain/train_end2end.py --cfg CFG --model-dir DIR [--dist] ...``."""
import _init_paths  # noqa: F401

from common.cli import run_main
from common.engine import train_main
from pretrain.task import TASK

if __name__ == "__main__":
    run_main(lambda: train_main(TASK, "Pretrain VL-BERT on image-caption pairs and a text corpus"))
