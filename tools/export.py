"""Export a trained model: a pickle-free safetensors hand-off folder, or an ONNX file checked against the model.

    python tools/export.py --cfg CFG --ckpt CKPT --format safetensors --out FOLDER
    python tools/export.py --cfg CFG --ckpt CKPT --format onnx --out FILE.onnx [--opset 18]

``--ckpt`` is a checkpoint file (``*.model``) or a hand-off folder (then ``--cfg`` may be left out: the folder's
``config.yaml`` is read). ``safetensors`` writes ``model.safetensors``, ``config.yaml``, the run folder's
predictor files (``predictor.json``: class names or answers) and the task's copies of files its config names
(VQA: ``answers.txt``) (:mod:`common.checkpoint.handoff`). ``onnx`` writes the task's graph
(:meth:`common.task.Task.onnx_graph`; the cls and vqa tasks), then runs it with onnxruntime on 3 inputs of other
batch sizes and lengths and prints ``max |onnx - eager| = X``; the file's ``metadata_props`` say how to feed it
(timm's ``pretrained_cfg`` names, values JSON-encoded: docs/export.md); the exit code is 1 when X exceeds 1e-4. A task
without a graph is refused by name with the reason (exit 2). Everything runs on the CPU in fp32. The task is the
one whose data set the config's ``DATASET.DATASET`` names (``--task`` to choose it).
"""
import argparse
import importlib
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.checkpoint.features import write_feature_handoff  # noqa: E402
from common.checkpoint.handoff import handoff_config, write_handoff  # noqa: E402
from common.checkpoint.run_files import RUN_INFO, read_run_info, run_folder  # noqa: E402
from common.cli import run_main  # noqa: E402
from common.config.handoff_folder import CONFIG_FILE, is_handoff  # noqa: E402
from common.engine import load_for_inference  # noqa: E402
from common.errors import ExportRefused, UserInputError  # noqa: E402
from common.inference.onnx_export import (DEFAULT_OPSET, TOLERANCE, check_onnx, check_opset,  # noqa: E402
                                          check_packages, export_onnx)
from common.inference.task_lookup import find_task  # noqa: E402
from common.task import get_task  # noqa: E402

TASK_PACKAGES = ("vcr", "vqa", "pretrain", "refcoco", "cls")
FORMATS = ("onnx", "safetensors")


def parse_args(argv=None):
    parser = argparse.ArgumentParser("Export a trained model to safetensors (hand-off folder) or ONNX")
    parser.add_argument("--cfg", help="config file (default with a hand-off folder as --ckpt: its config.yaml)")
    parser.add_argument("--ckpt", required=True, help="checkpoint file (*.model) or hand-off folder")
    parser.add_argument("--format", required=True, choices=FORMATS, help="what to write")
    parser.add_argument("--out", required=True, help="ONNX file (--format onnx) or folder (--format safetensors)")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET,
                        help="ONNX opset, 17 or more (default {})".format(DEFAULT_OPSET))
    parser.add_argument("--task", choices=TASK_PACKAGES, help="the task (default: the one of DATASET.DATASET)")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides KEY VALUE ...")
    return parser.parse_args(argv)


def task_of_config(path):
    """The registered task whose package defines the data set ``DATASET.DATASET`` of the YAML file ``path``
    (the first entry of a DATASET list).

    Raises:
        UserInputError: the file is unreadable or names no task's data set.
    """
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UserInputError("--cfg {}: not a readable YAML file ({})".format(path, e)) from None
    dataset = raw.get("DATASET") if isinstance(raw, dict) else None
    dataset = dataset[0] if isinstance(dataset, list) and dataset else dataset
    return find_task(dataset.get("DATASET") if isinstance(dataset, dict) else None, path)


def load_config(args):
    """``(task, cfg)`` of the command line: --cfg (or the hand-off folder's config.yaml) and --opts."""
    handoff = is_handoff(args.ckpt)
    if args.cfg is None and not handoff:
        raise UserInputError("--cfg is needed: --ckpt {} is not a hand-off folder".format(args.ckpt))
    cfg_path = args.cfg or os.path.join(args.ckpt, CONFIG_FILE)
    task = get_task(args.task) if args.task else task_of_config(cfg_path)
    if args.cfg is None:
        return task, handoff_config(args.ckpt, task, args.opts)
    return task, task.load_config(args.cfg, args.opts)


def run_metadata(ckpt):
    """ONNX metadata from the checkpoint's run folder: ``label_names``, the class names of a classifier."""
    classes = read_run_info(ckpt).get("classes")
    return {"label_names": [str(c) for c in classes]} if classes is not None else {}


def export_checked_onnx(task, cfg, model, path, opset, metadata=None):
    """Write the ONNX file (with the graph's ``metadata`` and ``metadata``) and compare it with ``model``; prints
    one line per checked input and the maximum. Returns the maximum difference."""
    graph = task.onnx_graph(cfg, model)
    export_onnx(graph, path, opset, metadata)
    print("wrote {} (opset {}; inputs {}; outputs {})".format(path, opset, ", ".join(graph.input_names),
                                                              ", ".join(graph.output_names)))
    results = check_onnx(graph, path)
    for shapes, diff in results:
        print("  onnxruntime on {}: max |onnx - eager| = {:.3g}".format(
            ", ".join("{} {}".format(n, list(s)) for n, s in zip(graph.input_names, shapes)), diff))
    return max(diff for _, diff in results)


def main(argv=None):
    args = parse_args(argv)
    for package in TASK_PACKAGES:
        importlib.import_module(package + ".task")
    if args.format == "onnx":
        check_opset(args.opset)
        check_packages()
    task, cfg = load_config(args)
    refusal = task.onnx_export_refusal(cfg) if args.format == "onnx" else None
    if refusal:
        raise ExportRefused(task.name, refusal)
    model = load_for_inference(task, cfg, args.ckpt, "cpu")
    if args.format == "safetensors":
        features, notes = write_feature_handoff(task, cfg, args.ckpt, args.out)
        run_info = os.path.join(run_folder(args.ckpt), RUN_INFO)
        for path in write_handoff(args.out, task, cfg, model, [run_info]) + features:
            print("wrote {}".format(path))
        for note in notes:
            print("note: {}".format(note))
        return 0
    worst = export_checked_onnx(task, cfg, model, args.out, args.opset, run_metadata(args.ckpt))
    print("max |onnx - eager| = {:.3g} (tolerance {:g})".format(worst, TOLERANCE))
    if worst > TOLERANCE:
        print("error: the ONNX graph differs from the eager model by more than {:g}".format(TOLERANCE),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
