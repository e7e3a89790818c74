"""VCR leaderboard files: Q2A, QA2R or both merged into Q2AR.

    python vcr/test.py --a-cfg CFG --a-ckpt CKPT [--r-cfg CFG --r-ckpt CKPT] [--result-path DIR]
"""
import _init_paths  # noqa: F401
import argparse
import os
import warnings

from common.cli import run_main
from common.engine import test_net
from vcr.function.result_csv import merge_results
from vcr.task import TASK


def parse_args():
    parser = argparse.ArgumentParser("VCR test-set result files")
    parser.add_argument("--a-cfg", help="config of the answer (Q2A) model")
    parser.add_argument("--r-cfg", help="config of the rationale (QA2R) model")
    parser.add_argument("--a-ckpt", help="checkpoint of the answer model")
    parser.add_argument("--r-ckpt", help="checkpoint of the rationale model")
    parser.add_argument("--a-bs", type=int, help="TEST.BATCH_IMAGES of the answer model")
    parser.add_argument("--r-bs", type=int, help="TEST.BATCH_IMAGES of the rationale model")
    parser.add_argument("--gpus", type=int, nargs="+", default=[0], help="accepted for compatibility; one device is used")
    parser.add_argument("--test-file", help="test annotation file instead of DATASET.TEST_ANNOTATION_FILE")
    parser.add_argument("--result-path", default="./test_result", help="folder of the CSV files")
    parser.add_argument("--result-name", default="vl-bert", help="file name prefix")
    parser.add_argument("--fp16", action="store_true",
                        help="accepted for compatibility; evaluation always runs in fp32 (see docs/vcr.md)")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides for both models")
    args = parser.parse_args()
    if not (args.a_ckpt or args.r_ckpt):
        parser.error("give --a-cfg/--a-ckpt, --r-cfg/--r-ckpt, or both")
    for cfg, ckpt in ((args.a_cfg, args.a_ckpt), (args.r_cfg, args.r_ckpt)):
        if bool(cfg) != bool(ckpt):
            parser.error("each checkpoint needs its config: --a-cfg with --a-ckpt, --r-cfg with --r-ckpt")
    return args


def _config(path, task, batch_size, args):
    opts = list(args.opts) + ["DATASET.TASK", task]
    if batch_size is not None:
        opts += ["TEST.BATCH_IMAGES", str(batch_size)]
    if args.test_file is not None:
        opts += ["DATASET.TEST_ANNOTATION_FILE", args.test_file]
    return TASK.load_config(path, opts)


def main():
    args = parse_args()
    if args.fp16:
        warnings.warn("--fp16 is ignored: evaluation runs in fp32, like epoch-end validation (fp16 logits of "
                      "close answers tie)")
    results = {}
    for task, cfg_path, ckpt, bs in (("Q2A", args.a_cfg, args.a_ckpt, args.a_bs),
                                     ("QA2R", args.r_cfg, args.r_ckpt, args.r_bs)):
        if ckpt:
            cfg = _config(cfg_path, task, bs, args)
            results[task] = test_net(TASK, cfg, ckpt, args.result_path, args.result_name)
    if len(results) == 2:
        merged = os.path.join(args.result_path, "{}_test_result_Q2AR.csv".format(args.result_name))
        merge_results(results["Q2A"], results["QA2R"], merged)
        print("merged result csv saved to {}".format(merged))


if __name__ == "__main__":
    run_main(main)
