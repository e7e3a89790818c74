"""VQA v2 result file for EvalAI: ``[{"question_id": int, "answer": str}, ...]`` covering every question.

    python vqa/test.py --cfg CFG --ckpt CKPT [--split test2015|test-dev2015] [--result-path DIR]
    scripts/dist_run_single.sh N vqa/test.py CFG --ckpt CKPT ...   # N ranks, one file

Writes ``{result-path}/{result-name}_vqa2_{split}.json``; with several ranks each predicts a shard
and rank 0 writes the gathered answers, each question once (the same file as one process).
"""
import _init_paths  # noqa: F401

from common.cli import run_main
from common.engine import test_net
from common.runtime import distributed as cdist
from vqa.function.cli import config_opts, parse_args, result_name
from vqa.task import TASK


def main(argv=None):
    args = parse_args("test", argv)
    cfg = TASK.load_config(args.cfg, config_opts("test", args))
    cdist.init_distributed(args.dist, args.slurm)
    try:
        test_net(TASK, cfg, args.ckpt, args.result_path, result_name(args))
    finally:
        cdist.cleanup()


if __name__ == "__main__":
    run_main(main)
