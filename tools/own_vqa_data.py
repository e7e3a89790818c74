"""Your own photos and questions as a VQA v2 data set in the reference's ``data/coco`` layout, so that
``vqa/train_end2end.py``, ``vqa/val.py`` and ``vqa/test.py`` read them (walkthrough: data/PREPARE_DATA.md,
"Your own photos and questions").

    python tools/own_vqa_data.py --images data/my_photos --qa data/my_qa.json --out data/my_vqa

``--qa`` is a JSON list, one object per question::

    [{"image": "kitchen/cat.jpg", "question": "what animal is on the table ?", "answer": "cat",
      "split": "train"},
     {"image": "dog.png", "question": "how many dogs ?", "answers": ["2", "2", "3"], "split": "val"},
     {"image": "park.jpg", "question": "is it sunny ?", "split": "test"}, ...]

``image`` is relative to ``--images``; ``answer`` (what all ten annotators said) or ``answers`` (1 to 10
annotators' answers, scored as the official metric scores them) is needed for ``train`` and ``val``;
``split`` is ``train`` (the default), ``val`` or ``test``, each with at least one question. The
image_id of a photo is its file name without the extension
(``common.data.region_features.image_id_from_name``), the name ``tools/extract_features.py`` gives
its feature file, so the features go, unchanged, into
``<out>/vgbua_res101_precomputed/trainval_resnet101_faster_rcnn_genome_36/`` (``DATASET.BOXES: '36'``;
the test split reads ``test2015_resnet101_faster_rcnn_genome_36/``, which this script links to it).

Written under ``--out``: ``vqa/v2_OpenEnded_mscoco_{train2014,val2014,test2015}_questions.json`` and
``vqa/v2_mscoco_{train2014,val2014}_annotations.json`` (empty lists for a split without questions). The
answer vocabulary is ``tools/build_vqa_answers.py`` on the train annotations.
"""
import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.cli import run_main  # noqa: E402
from common.data.loading import load_json  # noqa: E402
from common.data.region_features import image_id_from_name  # noqa: E402
from common.errors import UserInputError  # noqa: E402
from vqa.data.answers import normalize_answer  # noqa: E402
from vqa.data.vqa import ANNOTATION_FILE, FEATURE_FOLDERS, PRECOMPUTED_ROOT, QUESTION_FILE  # noqa: E402

# --qa split -> VQA split name, as DATASET.{TRAIN,VAL,TEST}_IMAGE_SET of the VQA configs name them.
SPLITS = {"train": "train2014", "val": "val2014", "test": "test2015"}
ANNOTATORS = 10  # answers per question in VQA v2; a single given answer counts as all of them


def parse_args(argv=None):
    parser = argparse.ArgumentParser("Photos + a JSON of questions and answers -> VQA v2-format files")
    parser.add_argument("--images", required=True, help="folder of the photos (the --qa 'image' paths are in it)")
    parser.add_argument("--qa", required=True, help="JSON list of {image, question, answer(s), split}")
    parser.add_argument("--out", required=True, help="DATASET.DATASET_PATH to write")
    return parser.parse_args(argv)


def _answer_type(answer):
    normal = normalize_answer(answer)
    if normal in ("yes", "no"):
        return "yes/no"
    return "number" if normal.isdigit() else "other"


def read_qa(path, images):
    """The questions of a QA file as ``{VQA split: [(question entry, annotation entry or None)]}``.

    Question ids are the entries' 1-based positions in the file; image ids come from the image names.

    Raises:
        UserInputError: not a list of objects; an entry without ``image`` / ``question``, an unknown
            ``split``, a train / val entry without answers, answers that are not 1 to 10 strings, an
            image that is not in ``images`` (names the file, the entry and the key), or a split without
            questions.
    """
    entries = load_json(path)
    if not isinstance(entries, list):
        raise UserInputError("{}: expected a JSON list of {{\"image\", \"question\", \"answer\", \"split\"}}"
                             .format(path))
    out = {split: [] for split in SPLITS.values()}
    for i, e in enumerate(entries):
        where = "{} entry {}".format(path, i)
        if not isinstance(e, dict):
            raise UserInputError("{}: expected an object".format(where))
        for key in ("image", "question"):
            if not isinstance(e.get(key), str) or not e[key].strip():
                raise UserInputError("{}: '{}' must be a non-empty string, got {!r}".format(where, key, e.get(key)))
        split = e.get("split", "train")
        if split not in SPLITS:
            raise UserInputError("{}: 'split' must be one of {}, got {!r}".format(where, ", ".join(SPLITS), split))
        if not os.path.isfile(os.path.join(images, e["image"])):
            raise UserInputError("{}: 'image' {} is not a file in {}".format(where, e["image"], images))
        answers = [e["answer"]] * ANNOTATORS if "answer" in e else e.get("answers")
        if split != "test" or answers is not None:
            if not (isinstance(answers, list) and 1 <= len(answers) <= ANNOTATORS
                    and all(isinstance(a, str) and a.strip() for a in answers)):
                raise UserInputError("{}: a {} question needs 'answer' (a string) or 'answers' (1 to {} strings), "
                                     "got {!r}".format(where, split, ANNOTATORS, answers))
        qid, image_id = i + 1, image_id_from_name(e["image"])
        question = {"question_id": qid, "image_id": image_id, "question": e["question"].strip()}
        annotation = None
        if split != "test":
            most = collections.Counter(answers).most_common(1)[0][0]
            annotation = {"question_id": qid, "image_id": image_id,
                          "question_type": " ".join(question["question"].split()[:2]),
                          "answer_type": _answer_type(most), "multiple_choice_answer": most,
                          "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": k + 1}
                                      for k, a in enumerate(answers)]}
        out[SPLITS[split]].append((question, annotation))
    empty = [name for name, split in SPLITS.items() if not out[split]]
    if empty:  # training validates on val and the walkthrough predicts test
        raise UserInputError("{}: no {} question (give each of train, val and test at least one 'split')".format(
            path, " or ".join(empty)))
    return out


def _dump(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f)


def write_vqa_files(out, records):
    """Write the question and annotation files of ``records`` (:func:`read_qa`) under ``out`` and link
    the test split's feature folder to the train/val one. Returns the feature folder to fill."""
    os.makedirs(os.path.join(out, "vqa"), exist_ok=True)
    for split, items in records.items():
        _dump(os.path.join(out, QUESTION_FILE.format(split)), {"questions": [q for q, _ in items],
                                                               "data_subtype": split})
        if split != "test2015":
            _dump(os.path.join(out, ANNOTATION_FILE.format(split)), {"annotations": [a for _, a in items],
                                                                     "data_subtype": split})
    trainval, test = FEATURE_FOLDERS["36"]
    features = os.path.join(out, PRECOMPUTED_ROOT, trainval)
    os.makedirs(features, exist_ok=True)
    link = os.path.join(out, PRECOMPUTED_ROOT, test)
    if not os.path.lexists(link):  # one feature file per photo serves every split
        os.symlink(trainval, link)
    return features


def main(argv=None):
    args = parse_args(argv)
    records = read_qa(args.qa, args.images)
    features = write_vqa_files(args.out, records)
    print("{}: {} (VQA v2 layout); region features go into {}".format(args.out, ", ".join(
        "{} {} questions".format(len(items), split) for split, items in records.items()), features))


if __name__ == "__main__":
    run_main(main)
