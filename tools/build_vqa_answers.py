"""Build a VQA answer vocabulary (``answers_vqa.txt``) from annotation files.

    python tools/build_vqa_answers.py --annotations data/coco/vqa/v2_mscoco_train2014_annotations.json \
        data/coco/vqa/v2_mscoco_val2014_annotations.json --out data/coco/vqa/answers_vqa.txt

An answer enters the vocabulary when, after the official normalisation, it is the
``multiple_choice_answer`` (the most common of the ten annotators' answers) of at least
``--min-count`` questions (9, the usual VQA v2 threshold). The file has the reference's layout:
``<unk>`` on the first line, then the answers in sorted (code point) order, one a line.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.cli import run_main  # noqa: E402
from vqa.data.answers import UNK, count_answers  # noqa: E402
from vqa.data.vqa_files import load_annotations  # noqa: E402

MIN_COUNT = 9


def parse_args(argv=None):
    parser = argparse.ArgumentParser("Build answers_vqa.txt from VQA annotation files")
    parser.add_argument("--annotations", nargs="+", required=True, help="v2_mscoco_<split>_annotations.json files")
    parser.add_argument("--out", required=True, help="answer file to write")
    parser.add_argument("--min-count", type=int, default=MIN_COUNT,
                        help="questions an answer must be the multiple-choice answer of (default 9)")
    return parser.parse_args(argv)


def build_answer_list(annotations, min_count=MIN_COUNT):
    """``['<unk>', answers...]``: normalised multiple-choice answers of at least ``min_count``
    questions, sorted; empty answers are left out."""
    counts = count_answers(annotations)
    return [UNK] + sorted(a for a, n in counts.items() if n >= min_count and a and a != UNK)


def main(argv=None):
    args = parse_args(argv)
    annotations = [a for path in args.annotations for a in load_annotations(path)]
    answers = build_answer_list(annotations, args.min_count)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("".join(a + "\n" for a in answers))
    print("{}: {} answers seen at least {} times in {} questions, plus {}".format(
        args.out, len(answers) - 1, args.min_count, len(annotations), UNK))


if __name__ == "__main__":
    run_main(main)
