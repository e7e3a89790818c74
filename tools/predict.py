"""Use a trained model of any task on your own images: a readable table and a JSON file of the predictions.

    python tools/predict.py --cfg CFG --ckpt CKPT --image photo.jpg [--question "what colour is the cat ?"] \
        [--answers A B C D] [--rationales R1 R2 R3 R4] [--expression TEXT] [--caption "a [MASK] on a bench"] \
        [--box-source grid|detector|file --grid 4x4 --detector-weights F --box-file F] [--feature-weights F] \
        [--topk 5] [--json out.json] [--attention DIR] [--device cpu] [--threads N] [--batch-size 8] \
        [--opts KEY VALUE ...]
    python tools/predict.py --cfg CFG --ckpt CKPT --images FOLDER [--questions questions.json] --json out.json

The task is the one whose data set the config names (``--task`` to say it). ``--questions`` is a JSON list of
inputs, ``[{"image": "a.jpg", "question": "..."}, ...]`` (or ``"expression"`` / ``"caption"`` / ``"answers"``,
``"rationales"``, ``"boxes"``), image paths relative to ``--images``; without it a folder run takes every image
file under the folder (sorted) with the one ``--question`` / ``--expression`` / ``--caption`` (none for cls).
The box-source flags are ``tools/extract_features.py``'s; the default is the run folder's record
(``feature_extractor.json``), else a 4x4 grid.

Output (``--json``): a list, one object per input in input order: ``image`` (the path as given), the input's
fields, ``predictions`` (best first, ``{"label", "index", "score"}``; see ``docs/predict.md`` for each task's
extra keys), or ``error`` for an input that could not be read (counted; the exit code is then 2).
``--attention DIR`` also writes each input's attention maps there (``pretrain/function/attention_maps.py``:
``attention_probs/ID.npy`` + ``.json``, ``maps/ID/*.png``). Exit 0, or 2 when an input or a file was bad.
"""
import argparse
import json
import os
import sys

import torch
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tqdm import tqdm  # noqa: E402

from common.cli import run_main  # noqa: E402
from common.data.box_sources import BOX_SOURCES, DEFAULT_DETECTOR, BoxSource  # noqa: E402
from common.errors import UserInputError  # noqa: E402
from common.fileio.safe_write import atomic_write  # noqa: E402
from common.inference import Predictor  # noqa: E402
import cls.task  # noqa: E402,F401  (each import registers its task)
import pretrain.task  # noqa: E402,F401
import refcoco.task  # noqa: E402,F401
import vcr.task  # noqa: E402,F401
import vqa.task  # noqa: E402,F401
from pretrain.function.attention_maps import file_stem, write_maps, write_raw  # noqa: E402

TEXT_FLAGS = ("question", "expression", "caption")


def add_model_arguments(parser):
    """The flags that build the predictor besides ``--cfg``/``--ckpt``: its box source (those of
    ``tools/extract_features.py``), the feature extractor's weights and the device. ``tools/serve_demo.py``
    takes the same."""
    parser.add_argument("--box-source", choices=BOX_SOURCES, help="boxes of the images (default: the run's record, "
                        "else grid)")
    parser.add_argument("--grid", default="4x4", help="box source 'grid': ROWSxCOLS (default 4x4)")
    parser.add_argument("--detector", default=DEFAULT_DETECTOR, help="box source 'detector': torchvision model name")
    parser.add_argument("--detector-weights", help="box source 'detector': its weights file (.pth / .safetensors)")
    parser.add_argument("--box-file", nargs="+", default=[], help="box source 'file': JSON lists of "
                        "{image_id, image, boxes} (tools/extract_features.py --boxes)")
    parser.add_argument("--feature-weights", help="image encoder weights of a model trained on precomputed features "
                        "(default: the run folder's feature_extractor.json; tools/extract_features.py --weights)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser("Predictions of a trained model on your images")
    parser.add_argument("--cfg", help="the config the model was trained with (default with a hand-off folder as "
                        "--ckpt: its config.yaml)")
    parser.add_argument("--ckpt", required=True, help="checkpoint file (*-best.model, *-0000.model) or hand-off folder "
                        "(tools/export.py --format safetensors)")
    parser.add_argument("--task", help="task name (default: the task of the config's DATASET.DATASET)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--image", help="one image file")
    where.add_argument("--images", help="a folder of images")
    parser.add_argument("--questions", help="with --images: JSON list of inputs, image paths relative to --images")
    parser.add_argument("--question", help="VQA / VCR: the question")
    parser.add_argument("--answers", nargs=4, metavar="A", help="VCR: the 4 answers")
    parser.add_argument("--rationales", nargs=4, metavar="R", help="VCR (QA2R model): the 4 rationales")
    parser.add_argument("--expression", help="RefCOCO+: the referring expression")
    parser.add_argument("--caption", help="pretraining: a caption with [MASK] words")
    add_model_arguments(parser)
    parser.add_argument("--topk", type=int, default=5, help="predictions per input (and per [MASK])")
    parser.add_argument("--batch-size", type=int, default=8, help="inputs per forward")
    parser.add_argument("--json", help="write the predictions to this JSON file")
    parser.add_argument("--attention", help="also write the attention maps of each input into this folder")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's; 1 on a busy machine)")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides KEY VALUE ...")
    args = parser.parse_args(argv)
    if args.questions and not args.images:
        raise UserInputError("--questions goes with --images FOLDER (its image paths are relative to it)")
    if args.topk < 1 or args.batch_size < 1:
        raise UserInputError("--topk and --batch-size must be >= 1")
    return args


def image_files(folder):
    """Every image file under ``folder`` (by extension, sorted, subfolders included), relative to it.

    Raises:
        UserInputError: not a folder, or no image in it.
    """
    if not os.path.isdir(folder):
        raise UserInputError("--images '{}' is not a folder".format(folder))
    extensions = {e.lower() for e in Image.registered_extensions()}
    names = sorted(os.path.relpath(os.path.join(d, n), folder) for d, _, files in os.walk(folder) for n in files
                   if os.path.splitext(n)[1].lower() in extensions)
    if not names:
        raise UserInputError("--images '{}': no image file".format(folder))
    return names


def read_inputs(args):
    """The input dicts of the command line, in order (image paths as given, for the output)."""
    common = {k: getattr(args, k) for k in TEXT_FLAGS + ("answers", "rationales") if getattr(args, k) is not None}
    if args.image:
        return [dict(common, image=args.image)]
    if not args.questions:
        return [dict(common, image=os.path.join(args.images, n)) for n in image_files(args.images)]
    try:
        with open(args.questions, encoding="utf-8") as f:
            listed = json.load(f)
    except (OSError, ValueError) as e:
        raise UserInputError("--questions {}: not a readable JSON file ({})".format(args.questions, e)) from None
    if not isinstance(listed, list) or not all(isinstance(e, dict) and isinstance(e.get("image"), str)
                                               for e in listed):
        raise UserInputError("--questions {}: expected a JSON list of {{\"image\": \"a.jpg\", ...}}".format(
            args.questions))
    return [dict(common, **dict(e, image=os.path.join(args.images, e["image"]))) for e in listed]


def box_source(args):
    """The :class:`BoxSource` of the flags, or None (the predictor's default) without ``--box-source``."""
    if args.box_source is None:
        return None
    return BoxSource(args.box_source, grid=args.grid, box_files=args.box_file, detector=args.detector,
                     detector_weights=args.detector_weights, device=args.device, cli=True)


def _label(p):
    return "{} ({:.3f})".format(p["label"], p["score"])


def table_lines(results):
    """Readable lines of the results: one block per input (image, inputs, predictions or error)."""
    lines = []
    for r in results:
        lines.append(str(r.get("image")))
        for key in TEXT_FLAGS:
            if r.get(key):
                lines.append("  {}: {}".format(key, r[key]))
        if "error" in r:
            lines.append("  error: {}".format(r["error"]))
            continue
        for key in ("predictions", "rationale_predictions"):
            for rank, p in enumerate(r.get(key) or [], 1):
                box = " box {}".format([round(v, 1) for v in p["box"]]) if "box" in p else ""
                lines.append("  {}{:>2}. {}{}".format("rationale " if key != "predictions" else "", rank,
                                                      _label(p), box))
        for k, mask in enumerate(r.get("masks") or []):
            lines.append("  [MASK] {}: {}".format(k + 1, ", ".join(_label(p) for p in mask)))
        if "filled" in r:
            lines.append("  filled: {}".format(r["filled"]))
    return lines


def write_attention(predictor, inp, out, ckpt):
    """Attention maps of one input under ``out`` (the maps code of ``pretrain/vis_attention_maps.py``)."""
    maps = predictor.attention(inp)
    name = os.path.splitext(os.path.basename(inp["image"]))[0] if isinstance(inp["image"], str) else "input"
    record = {"image_id": name, "image": inp["image"], "caption": " ".join(maps["tokens"][slice(*maps["text"])]),
              "image_size": list(maps["image"].size), "checkpoint": ckpt, "tokens": maps["tokens"],
              "text": list(maps["text"]), "regions": list(maps["regions"]), "boxes": maps["boxes"].tolist()}
    write_raw(out, name, maps["probs"], record)
    write_maps(out, name, maps["probs"], maps["tokens"], maps["text"], maps["regions"], maps["image"], maps["boxes"])
    return os.path.join(out, "maps", file_stem(name))


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    inputs = read_inputs(args)
    predictor = Predictor.from_checkpoint(args.cfg, args.ckpt, device=args.device, opts=args.opts,
                                          feature_weights=args.feature_weights, box_source=box_source(args),
                                          task=args.task, cli=True)
    results = []
    chunks = range(0, len(inputs), args.batch_size)
    for start in tqdm(chunks, desc="predict", unit="batch", disable=len(chunks) < 2):
        results += predictor(inputs[start:start + args.batch_size], topk=args.topk, strict=False)
    if args.attention:
        for inp, r in zip(inputs, results):
            if "error" not in r:
                print("attention maps: {}".format(write_attention(predictor, inp, args.attention, args.ckpt)))
    print("\n".join(table_lines(results)))
    if args.json:
        text = json.dumps(results, indent=1)
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        atomic_write(args.json, lambda f: f.write(text), binary=False, size_hint=len(text))
        print("predictions of {} input(s) written to {}".format(len(results), args.json))
    bad = [r for r in results if "error" in r]
    if bad:
        for r in bad:
            print("error: {}".format(r["error"]), file=sys.stderr)
        print("{} of {} input(s) could not be read".format(len(bad), len(results)), file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run_main(main)
