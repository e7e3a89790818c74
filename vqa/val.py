"""Official VQA accuracy of a checkpoint on a split with annotations (DATASET.VAL_IMAGE_SET).

    python vqa/val.py --cfg CFG --ckpt CKPT [--split minival2014] [--result-path DIR] [--opts ...]
    scripts/dist_run_single.sh N vqa/val.py CFG --ckpt CKPT ...   # N ranks

Prints what ``vqa/eval.py`` prints for the predicted answers (``Overall Accuracy is: XX.XX``, per
question type, per answer type): the official evaluation over every question of the split, those
whose answers are all outside the vocabulary included (they count 0). ``--result-path`` also
writes the predictions as ``{result-name}_vqa2_{split}.json``.
"""
import _init_paths  # noqa: F401
import argparse
import os
from contextlib import nullcontext

from common import distributed as cdist
from common.cli import run_main
from common.engine import build_loader, inference_device, load_for_inference
from vqa.data.vqa_files import load_annotations
from vqa.function.config import load_config
from vqa.function.evaluation import check_results, evaluate, format_accuracy
from vqa.function.test import predict_answers, result_json_path, write_result_json
from vqa.task import TASK


def parse_args(argv=None):
    parser = argparse.ArgumentParser("VQA v2 accuracy on a split with annotations (official metric)")
    parser.add_argument("--cfg", required=True, help="config of the model")
    parser.add_argument("--ckpt", required=True, help="checkpoint of the model")
    parser.add_argument("--split", help="DATASET.VAL_IMAGE_SET instead of the config's (e.g. minival2014)")
    parser.add_argument("--bs", type=int, help="VAL.BATCH_IMAGES (questions per batch and rank)")
    parser.add_argument("--model-dir", help="accepted for the launch scripts; unused")
    parser.add_argument("--result-path", help="also write the predictions as JSON into this folder")
    parser.add_argument("--result-name", help="file name prefix (default: the config's file name)")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides KEY VALUE ...")
    cdist.add_launcher_args(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    opts = list(args.opts)
    if args.split:
        opts += ["DATASET.VAL_IMAGE_SET", args.split]
    if args.bs is not None:
        opts += ["VAL.BATCH_IMAGES", str(args.bs)]
    cfg = load_config(args.cfg, opts)
    cdist.init_distributed(args.dist, args.slurm)
    try:
        model = load_for_inference(TASK, cfg, args.ckpt, inference_device())
        loader = build_loader(TASK, cfg, "val", cdist.get_world_size(), cdist.get_rank())
        results = predict_answers(model, loader, nullcontext)
        if args.result_path:
            name = args.result_name or os.path.splitext(os.path.basename(args.cfg))[0]
            write_result_json(results, result_json_path(args.result_path, name, cfg.DATASET.VAL_IMAGE_SET))
        if cdist.is_main_process():
            annotations = [a for path in loader.dataset.annotation_files for a in load_annotations(path)]
            answers = check_results(results, [a["question_id"] for a in annotations], "predictions")
            print(format_accuracy(evaluate(annotations, answers)))
    finally:
        cdist.cleanup()


if __name__ == "__main__":
    run_main(main)
