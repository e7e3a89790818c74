"""VQA answers: official normalisation, leave-one-out accuracy, soft scores, the answer vocabulary
and tools/build_vqa_answers.py."""
import importlib.util
import json
import os

import numpy as np
import pytest

from common.errors import UserInputError
from vqa.data.answers import (UNK, AnswerVocab, AnswerVocabError, leave_one_out_accuracy, normalize_answer,
                              process_punctuation, soft_scores, vqa_accuracy)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("build_vqa_answers",
                                               os.path.join(ROOT, "tools", "build_vqa_answers.py"))
build_vqa_answers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_vqa_answers)


@pytest.mark.parametrize("text, expected", [
    ("Two.", "2"),
    ("the dog", "dog"),
    ("none", "0"),
    ("A Red  Car", "red car"),           # lower case, article dropped, whitespace collapsed
    ("yes!", "yes"),                     # '!' next to nothing: becomes a space, then stripped by split
    ("t-shirt", "t shirt"),              # '-' not next to a space: becomes a space
    ("black - white", "black white"),    # '-' next to a space: deleted
    ("1,000", "1000"),                   # comma between digits: all marks deleted
    ("2.5", "2.5"),                      # period before a digit kept
    ("dont know", "don't know"),         # contraction
    ("\tten\n", "10"),
    ("it's an apple", "it's apple"),
    ("somebody'd", "somebodyd"),         # the official table's reversed entry
])
def test_normalize_answer_examples(text, expected):
    assert normalize_answer(text) == expected


def test_punctuation_keeps_case_and_deletes_at_most_32_periods():
    assert process_punctuation("Yes.") == "Yes"
    # The official code passes re.UNICODE (32) as re.sub's count.
    assert process_punctuation("." * 40) == "." * 8


@pytest.mark.parametrize("n, score", [(0, 0.0), (1, 0.3), (2, 0.6), (3, 0.9), (4, 1.0), (7, 1.0), (10, 1.0)])
def test_leave_one_out_scores_over_ten_annotators(n, score):
    gts = ["cat"] * n + ["dog"] * (10 - n)
    assert leave_one_out_accuracy("cat", gts) == pytest.approx(score, abs=1e-12)
    assert soft_scores(gts).get("cat", 0.0) == pytest.approx(score, abs=1e-12)


def test_leave_one_out_by_hand_with_three_annotators():
    # Leaving out the matching annotator leaves 0 matches, each other leaves 1: (0 + 1/3 + 1/3) / 3.
    assert leave_one_out_accuracy("a", ["a", "b", "c"]) == pytest.approx(2 / 9)
    with pytest.raises(ValueError):
        leave_one_out_accuracy("a", [])


def test_prediction_two_against_three_annotators_saying_two_scores_0_9():
    gts = ["2", "two", "Two.", "3", "3", "3", "3", "4", "4", "4"]
    assert vqa_accuracy("2", gts) == pytest.approx(0.9)
    assert vqa_accuracy("two", gts) == pytest.approx(0.9)  # the prediction is normalised too
    assert soft_scores(gts) == pytest.approx({"2": 0.9, "3": 1.0, "4": 0.9})


def test_official_rule_normalises_only_when_annotators_disagree():
    assert vqa_accuracy("Yes", ["yes"] * 10) == 0.0
    assert vqa_accuracy(" yes\n", ["yes"] * 10) == 1.0  # whitespace is always cleaned
    assert vqa_accuracy("Yes", ["yes"] * 9 + ["no"]) == 1.0
    # Training targets always normalise: ten "Yes" are a sure "yes".
    assert soft_scores(["Yes"] * 10) == {"yes": 1.0}


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_vocab_reads_reference_layout_and_builds_soft_targets(tmp_path):
    vocab = AnswerVocab.from_file(write_lines(tmp_path / "answers_vqa.txt", [UNK, "2", "Dog", "", "yes", "t-shirt"]))
    assert vocab.answers == [UNK, "2", "dog", "yes", "t shirt"]
    assert (len(vocab), vocab.unk_index, vocab.index("dog"), vocab.index("zebra")) == (5, 0, 2, 0)
    gts = ["two"] * 3 + ["dog"] * 6 + ["zebra"]
    target = vocab.soft_target(gts)
    assert target.dtype == np.float32
    np.testing.assert_allclose(target, [0.0, 0.9, 1.0, 0.0, 0.0], atol=1e-7)  # zebra (<unk>) adds nothing


def test_vocab_without_unk_is_an_error_naming_the_file(tmp_path):
    path = write_lines(tmp_path / "answers.txt", ["yes", "no"])
    with pytest.raises(AnswerVocabError, match=r"answers\.txt: no '<unk>' line") as info:
        AnswerVocab.from_file(path)
    assert isinstance(info.value, UserInputError)


def test_vocab_with_answers_equal_after_normalisation_is_an_error(tmp_path):
    path = write_lines(tmp_path / "answers.txt", [UNK, "two", "yes", "2"])
    with pytest.raises(AnswerVocabError, match=r"answers\.txt: answers 2 and 4 are both '2'"):
        AnswerVocab.from_file(path)


def annotation(qid, mc_answer, answers=None):
    answers = answers or [mc_answer] * 10
    return {"question_id": qid, "image_id": 1, "question_type": "what", "answer_type": "other",
            "multiple_choice_answer": mc_answer,
            "answers": [{"answer": a, "answer_id": i + 1, "answer_confidence": "yes"} for i, a in enumerate(answers)]}


def test_build_answer_list_counts_normalised_multiple_choice_answers():
    anns = ([annotation(i, "Two") for i in range(2)] + [annotation(10 + i, "2.") for i in range(1)]
            + [annotation(20 + i, "the cat") for i in range(3)] + [annotation(30 + i, "zebra") for i in range(2)]
            + [annotation(40 + i, "...") for i in range(5)])  # normalises to "", never an answer
    # Annotators' other answers do not count: only the multiple-choice answer of each question.
    anns.append(annotation(50, "zebra", ["cat"] * 10))
    assert build_vqa_answers.build_answer_list(anns, min_count=3) == [UNK, "2", "cat", "zebra"]
    assert build_vqa_answers.build_answer_list(anns, min_count=4) == [UNK]


def test_build_vqa_answers_script_writes_a_file_the_vocab_reads(tmp_path, capsys):
    files = []
    for split, anns in (("train", [annotation(i, "yes") for i in range(9)] + [annotation(9, "no")]),
                        ("val", [annotation(100 + i, "No") for i in range(8)] + [annotation(200, "blue")])):
        path = tmp_path / "v2_mscoco_{}2014_annotations.json".format(split)
        path.write_text(json.dumps({"annotations": anns}))
        files.append(str(path))
    out = tmp_path / "answers_vqa.txt"
    build_vqa_answers.main(["--annotations"] + files + ["--out", str(out)])
    assert out.read_text() == "<unk>\nno\nyes\n"
    assert "2 answers seen at least 9 times in 19 questions" in capsys.readouterr().out
    assert AnswerVocab.from_file(str(out)).answers == [UNK, "no", "yes"]
