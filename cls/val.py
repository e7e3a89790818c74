"""Top-1 / top-5 accuracy and mean cross-entropy of a checkpoint on ``DATASET.VAL_IMAGE_SET``.

    python cls/val.py --cfg CFG --ckpt CKPT [--opts KEY VALUE ...]

Prints ``cls <split>: top-1 0.812500, top-5 0.968750, loss 0.612345 (10000 images)``.
"""
import _init_paths  # noqa: F401

from common.cli import eval_argument_parser, run_main
from common.engine import build_loader, inference_device, load_for_inference
from common.inference.evaluation import MetricEvaluator, inference_on_dataset
from cls.task import TASK


def main():
    parser = eval_argument_parser("image classification: validation accuracy")
    args = parser.parse_args()
    cfg = TASK.load_config(args.cfg, args.opts)
    model = load_for_inference(TASK, cfg, args.ckpt, inference_device())
    loader = build_loader(TASK, cfg, "val")
    values = inference_on_dataset(model, loader, MetricEvaluator(TASK.build_metrics(cfg, False)),
                                  TASK.label_index_in_batch(cfg))
    print("cls {}: top-1 {:f}, top-5 {:f}, loss {:f} ({} images)".format(
        cfg.DATASET.VAL_IMAGE_SET, values["Acc"], values["Top5Acc"], values["Loss"], len(loader.dataset)))


if __name__ == "__main__":
    run_main(main)
