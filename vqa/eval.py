"""Local VQA evaluation with the official metric, for any split that has annotations.

    python vqa/eval.py --questions Q.json --annotations A.json --result R.json

Prints ``Overall Accuracy is: XX.XX`` and the accuracy per question type and per answer type
(yes/no, number, other), the numbers of the official evaluation code on the same files. A result
file that misses or repeats a question, or names an id outside the split, stops with
``error: ...`` naming the ids (exit code 2).
"""
import _init_paths  # noqa: F401
import argparse

from common.cli import run_main
from common.data.loading import load_json
from vqa.data.vqa_files import check_same_split, load_annotations, load_questions
from vqa.function.evaluation import check_results, evaluate, format_accuracy


def parse_args(argv=None):
    parser = argparse.ArgumentParser("VQA accuracy of a result file (official metric)")
    parser.add_argument("--questions", required=True, help="v2_OpenEnded_mscoco_<split>_questions.json")
    parser.add_argument("--annotations", required=True, help="v2_mscoco_<split>_annotations.json")
    parser.add_argument("--result", required=True, help="result JSON: [{\"question_id\": int, \"answer\": str}, ...]")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    annotations = load_annotations(args.annotations)
    check_same_split(load_questions(args.questions), annotations, args.questions, args.annotations)
    answers = check_results(load_json(args.result), [a["question_id"] for a in annotations], args.result)
    print(format_accuracy(evaluate(annotations, answers)))


if __name__ == "__main__":
    run_main(main)
