"""Official VQA accuracy of a checkpoint on a split with annotations (DATASET.VAL_IMAGE_SET).

    python vqa/val.py --cfg CFG --ckpt CKPT [--split minival2014] [--result-path DIR] [--opts ...]
    scripts/dist_run_single.sh N vqa/val.py CFG --ckpt CKPT ...   # N ranks

Prints what ``vqa/eval.py`` prints for the predicted answers (``Overall Accuracy is: XX.XX``, per
question type, per answer type): the official evaluation over every question of the split, those
whose answers are all outside the vocabulary included (they count 0). ``--result-path`` also
writes the predictions as ``{result-name}_vqa2_{split}.json``.
"""
import _init_paths  # noqa: F401

from common.cli import run_main
from common.engine import build_loader, inference_device, load_for_inference
from common.inference.evaluation import inference_on_dataset
from common.runtime import distributed as cdist
from vqa.data.vqa_files import load_annotations
from vqa.function.cli import config_opts, parse_args, result_name
from vqa.function.evaluation import check_results, evaluate, format_accuracy
from vqa.function.test import Answers, result_json_path, write_result_json
from vqa.task import TASK


def main(argv=None):
    args = parse_args("val", argv)
    cfg = TASK.load_config(args.cfg, config_opts("val", args))
    cdist.init_distributed(args.dist, args.slurm)
    try:
        model = load_for_inference(TASK, cfg, args.ckpt, inference_device())
        loader = build_loader(TASK, cfg, "val", cdist.get_world_size(), cdist.get_rank())
        results = inference_on_dataset(model, loader, Answers(loader.dataset), TASK.label_index_in_batch(cfg))
        if args.result_path:
            write_result_json(results, result_json_path(args.result_path, result_name(args), cfg.DATASET.VAL_IMAGE_SET))
        if cdist.is_main_process():
            annotations = [a for path in loader.dataset.annotation_files for a in load_annotations(path)]
            answers = check_results(results, [a["question_id"] for a in annotations], "predictions")
            print(format_accuracy(evaluate(annotations, answers)))
    finally:
        cdist.cleanup()


if __name__ == "__main__":
    run_main(main)
