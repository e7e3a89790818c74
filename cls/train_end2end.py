"""Train an image classifier: ``python cls/train_end2end.py --cfg CFG --model-dir DIR [--dist] [--do-test] ...``."""
import _init_paths  # noqa: F401

from common.cli import run_main
from common.engine import train_main
from cls.task import TASK

if __name__ == "__main__":
    run_main(lambda: train_main(TASK, "Train an image classifier (timm model)"))
