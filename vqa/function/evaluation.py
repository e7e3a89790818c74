"""The official VQA accuracy of a result file: overall, per question type and per answer type.

Numbers are those of the official evaluation code (github GT-Vision-Lab/VQA, ``vqaEval.py``) on the
same files: per question :func:`vqa.data.answers.vqa_accuracy`, then means over the questions in
percent, rounded to two decimals half away from zero (the official code runs on Python 2, whose
``round`` does that; Python 3's rounds exact halves to even).
"""
from decimal import ROUND_HALF_UP, Decimal

from common.errors import UserInputError
from vqa.data.answers import vqa_accuracy

__all__ = ["ANSWER_TYPES", "ResultFileError", "check_results", "evaluate", "format_accuracy", "round_half_away"]

# Print order of the answer types of VQA v2; other types follow in alphabetical order.
ANSWER_TYPES = ("yes/no", "number", "other")
# Ids listed in full in an error message; further ones are counted.
_SHOWN_IDS = 10


class ResultFileError(UserInputError):
    """A result file does not answer each question of the split exactly once."""


def _ids_text(ids):
    ids = sorted(ids)
    shown = ", ".join(str(i) for i in ids[:_SHOWN_IDS])
    return shown + (", ... ({} in all)".format(len(ids)) if len(ids) > _SHOWN_IDS else "")


def check_results(results, question_ids, source):
    """Validate a result list (the EvalAI format) and map question ids to answers.

    Args:
        results: parsed JSON, expected ``[{"question_id": int, "answer": str}, ...]``.
        question_ids: the ids of the split (from its annotations).
        source: the result file's name, for messages.
    Returns:
        dict ``{question_id: answer}`` covering ``question_ids`` exactly.
    Raises:
        ResultFileError: not a list, an entry without an int ``question_id`` or a str ``answer``
            (names its index), a question answered twice, an id not in the split, or questions
            without an answer (names the ids).
    """
    if not isinstance(results, list):
        raise ResultFileError("{}: expected a JSON list of {{\"question_id\": int, \"answer\": str}}, got {}"
                              .format(source, type(results).__name__))
    answers = {}
    for i, entry in enumerate(results):
        if not (isinstance(entry, dict) and isinstance(entry.get("question_id"), int)
                and isinstance(entry.get("answer"), str)):
            raise ResultFileError("{}: entry {} is not {{\"question_id\": int, \"answer\": str}}: {!r}"
                                  .format(source, i, entry))
        qid = entry["question_id"]
        if qid in answers:
            raise ResultFileError("{}: question_id {} is answered more than once".format(source, qid))
        answers[qid] = entry["answer"]
    question_ids = set(question_ids)
    unknown = answers.keys() - question_ids
    if unknown:
        raise ResultFileError("{}: question_id {} not in the annotations".format(source, _ids_text(unknown)))
    missing = question_ids - answers.keys()
    if missing:
        raise ResultFileError("{}: no answer for question_id {}".format(source, _ids_text(missing)))
    return answers


def round_half_away(value, digits=2):
    """``value`` rounded to ``digits`` decimals, exact halves away from zero (Python 2's ``round``)."""
    return float(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def _percent(accs):
    return round_half_away(100 * float(sum(accs)) / len(accs))


def evaluate(annotations, answers):
    """Official accuracies of ``answers`` on ``annotations``.

    Args:
        annotations: entries of an annotation file (:func:`vqa.data.vqa_files.load_annotations`).
        answers: ``{question_id: predicted answer}`` with every annotated question (see :func:`check_results`).
    Returns:
        dict with ``overall`` (float, percent, 2 decimals), ``perQuestionType`` and ``perAnswerType``
        (``{type: percent}``) and ``perQuestion`` (``{question_id: accuracy in [0, 1]}``, unrounded).
    """
    per_question = {}
    by_question_type, by_answer_type = {}, {}
    for ann in annotations:
        acc = vqa_accuracy(answers[ann["question_id"]], [a["answer"] for a in ann["answers"]])
        per_question[ann["question_id"]] = acc
        by_question_type.setdefault(ann["question_type"], []).append(acc)
        by_answer_type.setdefault(ann["answer_type"], []).append(acc)
    return {
        "overall": _percent(list(per_question.values())),
        "perQuestionType": {t: _percent(accs) for t, accs in by_question_type.items()},
        "perAnswerType": {t: _percent(accs) for t, accs in by_answer_type.items()},
        "perQuestion": per_question,
    }


def format_accuracy(accuracy):
    """The report printed by ``vqa/eval.py`` (the official demo's lines), as one string."""
    answer_types = [t for t in ANSWER_TYPES if t in accuracy["perAnswerType"]]
    answer_types += sorted(set(accuracy["perAnswerType"]) - set(ANSWER_TYPES))
    lines = ["Overall Accuracy is: %.02f" % accuracy["overall"], "", "Per Question Type Accuracy is the following:"]
    lines += ["%s : %.02f" % (t, accuracy["perQuestionType"][t]) for t in sorted(accuracy["perQuestionType"])]
    lines += ["", "Per Answer Type Accuracy is the following:"]
    lines += ["%s : %.02f" % (t, accuracy["perAnswerType"][t]) for t in answer_types]
    return "\n".join(lines)
