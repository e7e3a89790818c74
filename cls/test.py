"""Predictions CSV of a checkpoint on ``DATASET.TEST_IMAGE_SET``.

    python cls/test.py --cfg CFG --ckpt CKPT [--result-path DIR] [--result-name NAME] [--opts KEY VALUE ...]

Writes ``{result-path}/{result-name or MODEL_PREFIX}_{DATASET.DATASET}_{TEST_IMAGE_SET}.csv``
(:class:`cls.function.test.PredictionsCSV`) and prints its path.
"""
import _init_paths  # noqa: F401

from common.cli import eval_argument_parser, run_main
from common.engine import test_net
from cls.task import TASK


def main():
    parser = eval_argument_parser("image classification: predictions CSV")
    parser.add_argument("--result-path", default="./test_result", help="folder of the result file")
    parser.add_argument("--result-name", help="file name prefix (default MODEL_PREFIX)")
    args = parser.parse_args()
    cfg = TASK.load_config(args.cfg, args.opts)
    print(test_net(TASK, cfg, args.ckpt, args.result_path, args.result_name or cfg.MODEL_PREFIX))


if __name__ == "__main__":
    run_main(main)
