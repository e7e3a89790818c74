"""Split VQA v2 val2014 into minival2014 and valminusminival2014 by image.

    python tools/split_vqa_val.py --minival-images data/coco/annotations/instances_minival2014.json \
        --vqa-dir data/coco/vqa

Reads ``v2_OpenEnded_mscoco_val2014_questions.json`` and ``v2_mscoco_val2014_annotations.json`` from
``--vqa-dir`` and writes there, next to them, the same two files for ``minival2014`` (questions on
the listed images) and ``valminusminival2014`` (the others), so that a model trained on
``train2014+valminusminival2014`` is validated on questions it never saw.

``--minival-images`` lists the minival images: a COCO instances file (its ``images[].id``; the
usual one is Detectron's ``instances_minival2014.json``, 5,000 val2014 images, where the split names
come from), a JSON list of ids, or a text file with one id a line.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.cli import run_main  # noqa: E402
from common.data.loading import load_json  # noqa: E402
from common.errors import UserInputError  # noqa: E402
from vqa.data.vqa_files import load_annotations, load_questions  # noqa: E402

QUESTIONS = "v2_OpenEnded_mscoco_{}_questions.json"
ANNOTATIONS = "v2_mscoco_{}_annotations.json"
SOURCE, MINIVAL, REST = "val2014", "minival2014", "valminusminival2014"


def parse_args(argv=None):
    parser = argparse.ArgumentParser("Split VQA val2014 into minival2014 and valminusminival2014")
    parser.add_argument("--minival-images", required=True, help="COCO instances JSON, JSON id list or text file of ids")
    parser.add_argument("--vqa-dir", required=True, help="folder of the official VQA files (read and written)")
    return parser.parse_args(argv)


def read_image_ids(path):
    """Set of int image ids from a COCO instances file, a JSON list or a text file of ids.

    Raises:
        UserInputError: none of these formats (names the file).
    """
    if path.endswith(".json"):
        data = load_json(path)
        ids = [image["id"] for image in data.get("images", [])] if isinstance(data, dict) else data
    else:
        with open(path) as f:
            ids = [line.strip() for line in f if line.strip()]
    try:
        return {int(i) for i in ids}
    except (TypeError, ValueError, KeyError):
        raise UserInputError("{}: expected a COCO instances file, a JSON list of image ids or one id a line"
                             .format(path)) from None


def _write(path, template, list_key, entries, subtype):
    data = dict(template, data_subtype=subtype)
    data[list_key] = entries
    with open(path, "w") as f:
        json.dump(data, f)


def main(argv=None):
    args = parse_args(argv)
    minival = read_image_ids(args.minival_images)
    q_path = os.path.join(args.vqa_dir, QUESTIONS.format(SOURCE))
    a_path = os.path.join(args.vqa_dir, ANNOTATIONS.format(SOURCE))
    questions, annotations = load_questions(q_path), load_annotations(a_path)
    if not minival & {q["image_id"] for q in questions}:
        raise UserInputError("{}: none of its {} images has a question in {}".format(
            args.minival_images, len(minival), q_path))
    q_file, a_file = load_json(q_path), load_json(a_path)  # keep info, license, ... of the originals
    for subset, keep in ((MINIVAL, lambda e: e["image_id"] in minival), (REST, lambda e: e["image_id"] not in minival)):
        qs = [q for q in questions if keep(q)]
        _write(os.path.join(args.vqa_dir, QUESTIONS.format(subset)), q_file, "questions", qs, subset)
        _write(os.path.join(args.vqa_dir, ANNOTATIONS.format(subset)), a_file, "annotations",
               [a for a in annotations if keep(a)], subset)
        print("{}: {} questions on {} images".format(subset, len(qs), len({q["image_id"] for q in qs})))


if __name__ == "__main__":
    run_main(main)
