"""Reading the official VQA v2 question and annotation files, with errors that name the file and id.

Questions (``v2_OpenEnded_mscoco_<split>_questions.json``): ``{"questions": [{"question_id": int,
"image_id": int, "question": str}, ...], "info", "task_type", "data_type", "data_subtype", "license"}``.

Annotations (``v2_mscoco_<split>_annotations.json``): ``{"annotations": [{"question_id": int,
"image_id": int, "question_type": str, "answer_type": "yes/no" | "number" | "other",
"multiple_choice_answer": str, "answers": [{"answer": str, "answer_confidence": str,
"answer_id": int}, ...10]}, ...], ...}``.
"""
from common.data.loading import load_json
from common.errors import UserInputError

__all__ = ["VqaFileError", "check_same_split", "load_annotations", "load_questions"]

QUESTION_KEYS = ("question_id", "image_id", "question")
ANNOTATION_KEYS = ("question_id", "image_id", "question_type", "answer_type", "multiple_choice_answer", "answers")


class VqaFileError(UserInputError):
    """A question or annotation file does not have the official layout."""


def _entries(path, list_key, keys):
    data = load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get(list_key), list):
        raise VqaFileError("{}: expected a JSON object with a '{}' list (the official VQA layout)".format(
            path, list_key))
    seen = set()
    for i, entry in enumerate(data[list_key]):
        if not isinstance(entry, dict):
            raise VqaFileError("{}: {}[{}] is not an object".format(path, list_key, i))
        where = ("question_id {}".format(entry["question_id"]) if "question_id" in entry
                 else "{}[{}]".format(list_key, i))
        missing = [k for k in keys if k not in entry]
        if missing:
            raise VqaFileError("{}: {} lacks {}".format(path, where, ", ".join(repr(k) for k in missing)))
        if entry["question_id"] in seen:
            raise VqaFileError("{}: question_id {} appears twice".format(path, entry["question_id"]))
        seen.add(entry["question_id"])
    return data[list_key]


def load_questions(path):
    """The ``questions`` list of a question file (plain or ``archive.zip@/member``).

    Raises:
        FileNotFoundError: no such file.
        VqaFileError: not the official layout, an entry lacks a key, or a question_id repeats.
    """
    return _entries(path, "questions", QUESTION_KEYS)


def load_annotations(path):
    """The ``annotations`` list of an annotation file; each entry's ``answers`` is a non-empty list
    of objects with an ``answer`` string.

    Raises:
        FileNotFoundError: no such file.
        VqaFileError: as :func:`load_questions`, or bad ``answers`` (message names the question_id).
    """
    annotations = _entries(path, "annotations", ANNOTATION_KEYS)
    for entry in annotations:
        answers = entry["answers"]
        if not (isinstance(answers, list) and answers
                and all(isinstance(a, dict) and isinstance(a.get("answer"), str) for a in answers)):
            raise VqaFileError("{}: question_id {}: 'answers' must be a non-empty list of {{\"answer\": str, ...}}"
                               .format(path, entry["question_id"]))
    return annotations


def check_same_split(questions, annotations, questions_path, annotations_path):
    """Raise VqaFileError naming a question_id that only one of the two lists has."""
    unmatched = {q["question_id"] for q in questions}.symmetric_difference(a["question_id"] for a in annotations)
    if unmatched:
        raise VqaFileError("{} and {} are not the same split: question_id {} is in only one of them".format(
            questions_path, annotations_path, min(unmatched)))
