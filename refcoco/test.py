"""RefCOCO+ result files and accuracy (the test labels are public), the reference's command line.

    python refcoco/test.py --cfg CFG --ckpt CKPT [--split val|testA|testB|test ...] [--bs N]
                           [--result-path DIR] [--result-name NAME] [--opts KEY VALUE ...]

For each split: ``{result-path}/{result-name or MODEL_PREFIX}_refcoco+_{split}.json`` (one predicted box per
expression, keyed by ref id) and the accuracy, per split of the refs (``test`` is testA and testB).
Boxes: ``DATASET.TEST_BOXES``.
"""
import _init_paths  # noqa: F401

from common.cli import eval_argument_parser, run_main
from common.engine import test_net
from refcoco.data.refer import SPLITS
from refcoco.task import TASK


def parse_args():
    parser = eval_argument_parser("RefCOCO+ result files and accuracy")
    parser.add_argument("--split", nargs="+", default=["val"], choices=[s for s in SPLITS if s != "train"],
                        help="split(s) to predict (default val)")
    parser.add_argument("--bs", type=int, help="TEST.BATCH_IMAGES")
    parser.add_argument("--gpus", type=int, nargs="+", default=[0],
                        help="accepted for compatibility; one device is used")
    parser.add_argument("--result-path", default="./test_result", help="folder of the result files")
    parser.add_argument("--result-name", help="file name prefix (default MODEL_PREFIX)")
    return parser.parse_args()


def main():
    args = parse_args()
    for split in args.split:
        opts = list(args.opts) + ["DATASET.TEST_IMAGE_SET", split]
        if args.bs is not None:
            opts += ["TEST.BATCH_IMAGES", str(args.bs)]
        cfg = TASK.load_config(args.cfg, opts)
        test_net(TASK, cfg, args.ckpt, args.result_path, args.result_name or cfg.MODEL_PREFIX)


if __name__ == "__main__":
    run_main(main)
