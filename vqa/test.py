"""VQA v2 result file for EvalAI: ``[{"question_id": int, "answer": str}, ...]`` covering every question.

    python vqa/test.py --cfg CFG --ckpt CKPT [--split test2015|test-dev2015] [--result-path DIR]
    scripts/dist_run_single.sh N vqa/test.py CFG --ckpt CKPT ...   # N ranks, one file

Writes ``{result-path}/{result-name}_vqa2_{split}.json``; with several ranks each predicts a shard
and rank 0 writes the gathered answers, each question once (the same file as one process).
"""
import _init_paths  # noqa: F401
import argparse
import os

from common import distributed as cdist
from common.cli import run_main
from common.engine import test_net
from vqa.function.config import load_config
from vqa.task import TASK


def parse_args(argv=None):
    parser = argparse.ArgumentParser("VQA v2 test-set result file (EvalAI format)")
    parser.add_argument("--cfg", required=True, help="config of the model")
    parser.add_argument("--ckpt", required=True, help="checkpoint of the model")
    parser.add_argument("--bs", type=int, help="TEST.BATCH_IMAGES (questions per batch and rank)")
    parser.add_argument("--gpus", type=int, nargs="+", help="accepted for compatibility; one device per rank")
    parser.add_argument("--model-dir", help="accepted for the launch scripts; unused")
    parser.add_argument("--split", default="test2015", help="DATASET.TEST_IMAGE_SET (test2015, test-dev2015, ...)")
    parser.add_argument("--result-path", default="./test_result", help="folder of the JSON file")
    parser.add_argument("--result-name", help="file name prefix (default: the config's file name)")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides KEY VALUE ...")
    cdist.add_launcher_args(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    opts = list(args.opts) + ["DATASET.TEST_IMAGE_SET", args.split]
    if args.bs is not None:
        opts += ["TEST.BATCH_IMAGES", str(args.bs)]
    cfg = load_config(args.cfg, opts)
    name = args.result_name or os.path.splitext(os.path.basename(args.cfg))[0]
    cdist.init_distributed(args.dist, args.slurm)
    try:
        test_net(TASK, cfg, args.ckpt, args.result_path, name)
    finally:
        cdist.cleanup()


if __name__ == "__main__":
    run_main(main)
