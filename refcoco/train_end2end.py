"""Train (fine-tune) VL-BERT on RefCOCO+: ``python refcoco/train_end2end.py --cfg CFG --model-dir DIR [--dist] ...``."""
import _init_paths  # noqa: F401

from common.cli import run_main
from common.engine import train_main
from refcoco.task import TASK

if __name__ == "__main__":
    run_main(lambda: train_main(TASK, "Train VL-BERT on RefCOCO+"))
