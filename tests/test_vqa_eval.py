"""vqa/eval.py and vqa.function.evaluation on a hand-made split with hand-computed accuracies."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from common.errors import UserInputError
from vqa.data.vqa_files import VqaFileError, check_same_split, load_annotations, load_questions
from vqa.function.evaluation import ResultFileError, check_results, evaluate, round_half_away

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (question_id, question_type, answer_type, ten annotator answers, prediction, official accuracy by hand)
CASES = [
    (1, "is the", "yes/no", ["yes"] * 10, "yes", 1.0),
    (2, "is the", "yes/no", ["no"] * 7 + ["yes"] * 3, "yes", 0.9),
    (3, "how many", "number", ["2", "two", "Two.", "3", "3", "3", "3", "4", "4", "4"], "2", 0.9),
    # All ten annotators agree: the official code compares without normalising, "2" != "Two".
    (4, "how many", "number", ["Two"] * 10, "2", 0.0),
    (5, "what", "other", ["the dog", "the dog", "dog", "a dog"] + ["cat"] * 6, "Dog", 1.0),
    (6, "what", "other", ["red"] * 5 + ["blue"] * 5, "green", 0.0),
    (7, "what color", "other", ["cat"] + ["dog"] * 9, "cat", 0.3),
]
# Overall 4.1 / 7 = 58.571..%; yes/no (1 + 0.9) / 2; number (0.9 + 0) / 2; other 1.3 / 3 = 43.33..%.
EXPECTED_REPORT = """Overall Accuracy is: 58.57

Per Question Type Accuracy is the following:
how many : 45.00
is the : 95.00
what : 50.00
what color : 30.00

Per Answer Type Accuracy is the following:
yes/no : 95.00
number : 45.00
other : 43.33
"""


def write_split(folder, results=None):
    """Question, annotation and result files of CASES; ``results`` replaces the result list."""
    questions = {"questions": [{"question_id": q, "image_id": 100 + q, "question": "q{}?".format(q)}
                               for q, *_ in CASES]}
    annotations = {"annotations": [
        {"question_id": q, "image_id": 100 + q, "question_type": qt, "answer_type": at,
         "multiple_choice_answer": gts[0],
         "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": i + 1} for i, a in enumerate(gts)]}
        for q, qt, at, gts, _, _ in CASES]}
    if results is None:
        results = [{"question_id": q, "answer": pred} for q, _, _, _, pred, _ in CASES]
    paths = {}
    for name, data in (("questions", questions), ("annotations", annotations), ("result", results)):
        paths[name] = str(folder / "{}.json".format(name))
        with open(paths[name], "w") as f:
            json.dump(data, f)
    return paths


def run_eval(paths):
    cmd = [sys.executable, os.path.join(ROOT, "vqa", "eval.py")]
    for name in ("questions", "annotations", "result"):
        cmd += ["--" + name, paths[name]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_eval_script_prints_hand_computed_official_accuracies(tmp_path):
    proc = run_eval(write_split(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == EXPECTED_REPORT


def test_evaluate_gives_each_question_its_hand_computed_accuracy(tmp_path):
    paths = write_split(tmp_path)
    anns = load_annotations(paths["annotations"])
    accuracy = evaluate(anns, {q: pred for q, _, _, _, pred, _ in CASES})
    assert accuracy["perQuestion"] == pytest.approx({q: acc for q, *_, acc in CASES})
    assert accuracy["overall"] == 58.57
    assert accuracy["perAnswerType"] == {"yes/no": 95.0, "number": 45.0, "other": 43.33}


def test_eval_script_result_with_a_repeated_question_is_one_error_line(tmp_path):
    results = [{"question_id": q, "answer": "yes"} for q, *_ in CASES] + [{"question_id": 5, "answer": "no"}]
    proc = run_eval(write_split(tmp_path, results))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: {}: question_id 5 is answered more than once".format(tmp_path / "result.json")]


@pytest.mark.parametrize("results, message", [
    ([{"question_id": q, "answer": "yes"} for q in (1, 2, 3, 5, 6, 7)], "no answer for question_id 4"),
    ([{"question_id": q, "answer": "yes"} for q in range(1, 8)] + [{"question_id": 999, "answer": "no"}],
     "question_id 999 not in the annotations"),
    ([{"question_id": 1, "answer": "yes"}, {"question_id": 1, "answer": "no"}], "question_id 1 is answered more"),
    ([{"question_id": "1", "answer": "yes"}], r"entry 0 is not \{\"question_id\": int"),
    ({"1": "yes"}, "expected a JSON list"),
])
def test_result_errors_name_the_file_and_the_id(results, message):
    with pytest.raises(ResultFileError, match="R.json: " + message) as info:
        check_results(results, range(1, 8), "R.json")
    assert isinstance(info.value, UserInputError)


def test_missing_ids_are_listed_up_to_ten_then_counted():
    with pytest.raises(ResultFileError, match=r"no answer for question_id 0, 1, .*, 9, \.\.\. \(12 in all\)"):
        check_results([], range(12), "R.json")


def test_questions_and_annotations_of_different_splits_are_an_error(tmp_path):
    anns = load_annotations(write_split(tmp_path)["annotations"])
    with pytest.raises(VqaFileError, match="Q.json and A.json are not the same split: question_id 2 is in only one"):
        check_same_split([{"question_id": 1}], anns, "Q.json", "A.json")


def test_malformed_question_and_annotation_files_name_the_id(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(json.dumps({"questions": [{"question_id": 7, "image_id": 1}]}))
    with pytest.raises(VqaFileError, match=r"q\.json: question_id 7 lacks 'question'"):
        load_questions(str(path))
    path.write_text(json.dumps({"annotations": [
        {"question_id": 8, "image_id": 1, "question_type": "what", "answer_type": "other",
         "multiple_choice_answer": "x", "answers": []}]}))
    with pytest.raises(VqaFileError, match=r"q\.json: question_id 8: 'answers' must be a non-empty list"):
        load_annotations(str(path))
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(VqaFileError, match="expected a JSON object with a 'questions' list"):
        load_questions(str(path))


def test_rounding_is_half_away_from_zero_like_the_official_python2_code():
    assert round_half_away(12.125) == 12.13  # exactly representable half: Python 3's round gives 12.12
    assert round(12.125, 2) == 12.12
    assert round_half_away(2.675) == 2.67    # 2.675 is stored as 2.67499..: no half
    assert round_half_away(58.571428) == 58.57


def test_split_vqa_val_by_minival_images(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("split_vqa_val", os.path.join(ROOT, "tools", "split_vqa_val.py"))
    split = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(split)
    paths = write_split(tmp_path)
    for name, official in (("questions", "v2_OpenEnded_mscoco_val2014_questions.json"),
                           ("annotations", "v2_mscoco_val2014_annotations.json")):
        data = json.load(open(paths[name]))
        data.update(info={"version": "2.0"}, data_subtype="val2014")
        json.dump(data, open(str(tmp_path / official), "w"))
    # A COCO instances file listing images 102 and 105 (questions 2 and 5), plus one without questions.
    (tmp_path / "instances_minival2014.json").write_text(json.dumps({"images": [{"id": 102}, {"id": 105}, {"id": 1}]}))
    split.main(["--minival-images", str(tmp_path / "instances_minival2014.json"), "--vqa-dir", str(tmp_path)])
    assert capsys.readouterr().out.splitlines() == ["minival2014: 2 questions on 2 images",
                                                    "valminusminival2014: 5 questions on 5 images"]
    for subset, ids in (("minival2014", [2, 5]), ("valminusminival2014", [1, 3, 4, 6, 7])):
        qs = json.load(open(str(tmp_path / "v2_OpenEnded_mscoco_{}_questions.json".format(subset))))
        anns = json.load(open(str(tmp_path / "v2_mscoco_{}_annotations.json".format(subset))))
        assert [q["question_id"] for q in qs["questions"]] == [a["question_id"] for a in anns["annotations"]] == ids
        assert (qs["data_subtype"], qs["info"], anns["data_subtype"]) == (subset, {"version": "2.0"}, subset)
    (tmp_path / "ids.txt").write_text("1\n999\n")
    with pytest.raises(UserInputError, match=r"ids\.txt: none of its 2 images has a question"):
        split.main(["--minival-images", str(tmp_path / "ids.txt"), "--vqa-dir", str(tmp_path)])
