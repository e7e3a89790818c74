"""RefCOCO+ accuracy on the validation split(s) of the config.

    python refcoco/val.py --cfg CFG --ckpt CKPT [--opts KEY VALUE ...]

Evaluates ``DATASET.VAL_IMAGE_SET`` with ``DATASET.VAL_BOXES`` through the epoch-end validation loop (fp32)
and prints the accuracy of each split of the refs, then over all of them when several.
"""
import _init_paths  # noqa: F401

from common.cli import eval_argument_parser, run_main
from refcoco.function.test import print_accuracies, val_accuracies
from refcoco.task import TASK


def main():
    parser = eval_argument_parser("RefCOCO+ validation accuracy")
    args = parser.parse_args()
    print_accuracies(val_accuracies(TASK, TASK.load_config(args.cfg, args.opts), args.ckpt))


if __name__ == "__main__":
    run_main(main)
