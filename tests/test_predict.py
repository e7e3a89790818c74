"""The predictor (common/predict.py) and scripts/predict.py on tiny trained checkpoints: a prediction equals what
the task's test.py / val.py computes for the same item of a tiny data set, batching changes nothing, bad inputs
give one clear UserInputError (the script: an ``error:`` line, exit 2)."""
import json
import os

import pytest
import torch

from common.data.build import make_dataloader
from common.engine import load_for_inference
from common.errors import UserInputError
from common.evaluation import DatasetEvaluator, inference_on_dataset
from common.predict import Predictor
from tests import tiny_vqa
from tests.conftest import ROOT
from tests.tiny_vcr import run_script

VQA_CFG = tiny_vqa.CFGS["base_4x16G_fp32"]
# The encoder of the tiny precomputed features: a random ResNet-50 (2048-d, what VQA's reader checks) on
# small images.
FEATURE_OPTS = ["NETWORK.IMAGE_NUM_LAYERS", "50", "SCALES", "[48, 64]"]


class _Logits(DatasetEvaluator):
    """Every batch's outputs of one name, concatenated in loader order."""

    def __init__(self, name):
        self.name = name

    def reset(self):
        self.rows = []

    def process(self, inputs, outputs):
        self.rows.append(outputs[self.name].float().cpu())

    def evaluate(self):
        return torch.cat(self.rows)


def _assert_same_predictions(results, expected, key="predictions"):
    """Same labels and indices in the same order, scores within 1e-6."""
    assert len(results) == len(expected)
    for a, b in zip(results, expected):
        assert [(p["label"], p["index"]) for p in a[key]] == [(p["label"], p["index"]) for p in b[key]]
        assert [p["score"] for p in a[key]] == pytest.approx([p["score"] for p in b[key]], abs=1e-6)


def _feature_folder(inputs, split):
    return os.path.join(inputs.coco, "vgbua_res101_precomputed", tiny_vqa.FEATURE_FOLDERS[split])


@pytest.fixture(scope="module")
def vqa_run(tmp_path_factory):
    """A tiny VQA model trained on features that scripts/extract_features.py made from the tiny images with a
    random ResNet-50 (boxes from a file), and its test.py JSON. Returns a dict of paths and opts."""
    from bench.smoke_paper_config import random_resnet_file
    from common.data.region_features import read_feature_json

    root = tmp_path_factory.mktemp("predict_vqa")
    inputs = tiny_vqa.make_inputs(root)
    tiny_vqa.write_images(inputs)
    random_resnet_file(str(root / "resnet50"), 50)
    weights = str(root / "resnet50-0000.model")
    entries = {}
    for image_id, (split, _) in tiny_vqa.IMAGES.items():
        regions = read_feature_json(os.path.join(_feature_folder(inputs, split), "{}.json".format(image_id)))
        image = "{0}/COCO_{0}_{1:012d}.jpg".format(split, image_id)
        entries.setdefault(split, []).append({"image_id": image_id, "image": image, "boxes": regions.boxes.tolist()})
    for split, listed in entries.items():
        boxes = root / "boxes_{}.json".format(split)
        boxes.write_text(json.dumps(listed))
        assert run_script(os.path.join(ROOT, "scripts", "extract_features.py"), [
            "--boxes", str(boxes), "--image-root", inputs.coco, "--out", _feature_folder(inputs, split),
            "--cfg", VQA_CFG, "--weights", weights, "--device", "cpu", "--opts"] + FEATURE_OPTS) in (0, None)
    opts = inputs.opts() + FEATURE_OPTS
    model_dir = root / "model"
    assert tiny_vqa.run_entry("train_end2end.py", ["--cfg", VQA_CFG, "--model-dir", str(model_dir),
                                                   "--opts"] + opts) == 0
    ckpt = os.path.join(tiny_vqa.output_folder(model_dir, "base_4x16G_fp32"), "vl-bert_base_res101_vqa-0000.model")
    assert tiny_vqa.run_entry("test.py", ["--cfg", VQA_CFG, "--ckpt", ckpt, "--result-path", str(root / "res"),
                                          "--opts"] + opts) == 0
    return dict(root=root, inputs=inputs, opts=opts, ckpt=ckpt, weights=weights,
                test_json=str(root / "res" / "base_4x16G_fp32_vqa2_test2015.json"),
                box_files=[str(root / "boxes_{}.json".format(s)) for s in entries])


@pytest.fixture(scope="module")
def vqa_predictor(vqa_run):
    return Predictor.from_checkpoint(VQA_CFG, vqa_run["ckpt"], opts=vqa_run["opts"],
                                     feature_weights=vqa_run["weights"],
                                     box_source={"kind": "file", "box_files": vqa_run["box_files"]})


def _test_questions(vqa_run):
    coco = vqa_run["inputs"].coco
    return [{"image": os.path.join(coco, "test2015", "COCO_test2015_{:012d}.jpg".format(i)), "question": q}
            for _, i, q, _ in tiny_vqa.QUESTIONS["test2015"]]


def test_vqa_predictions_equal_test_py_answers_and_the_data_sets_scores(vqa_run, vqa_predictor):
    questions = _test_questions(vqa_run)
    results = vqa_predictor(questions, topk=3)
    written = json.load(open(vqa_run["test_json"]))
    assert [r["predictions"][0]["label"] for r in results] == [w["answer"] for w in written]
    # The scores: the sigmoid (ANS_LOSS_TYPE bce) of the logits test.py's loop computes on the data set.
    cfg = vqa_predictor.cfg
    model = load_for_inference(vqa_predictor.task, cfg, vqa_run["ckpt"], torch.device("cpu"))
    logits = inference_on_dataset(model, make_dataloader(cfg, "test"), _Logits("label_logits"))
    expected = torch.sigmoid(logits)
    for r, row in zip(results, expected):
        top = torch.sort(row, descending=True, stable=True)
        assert [p["index"] for p in r["predictions"]] == top.indices[:3].tolist()
        assert [p["score"] for p in r["predictions"]] == pytest.approx(top.values[:3].tolist(), abs=1e-6)
        assert [p["label"] for p in r["predictions"]] == [tiny_vqa.ANSWERS[i] for i in top.indices[:3].tolist()]
    # The boxes used: the whole image, then the file's boxes of the image.
    assert results[0]["boxes"][0] == [0.0, 0.0, 39.0, 29.0] and len(results[0]["boxes"]) == 1 + 3


def test_three_inputs_in_one_call_equal_three_calls(vqa_run, vqa_predictor):
    questions = _test_questions(vqa_run)[:3]
    _assert_same_predictions(vqa_predictor(questions), [vqa_predictor(q)[0] for q in questions])


def test_bad_vqa_inputs_are_named(vqa_run, vqa_predictor, tmp_path):
    image = _test_questions(vqa_run)[0]["image"]
    (tmp_path / "notes.jpg").write_text("not an image")
    with pytest.raises(UserInputError, match=r"notes\.jpg: not an image"):
        vqa_predictor({"image": str(tmp_path / "notes.jpg"), "question": "what?"})
    with pytest.raises(UserInputError, match=r"'question' must be non-empty text"):
        vqa_predictor({"image": image, "question": "  "})
    with pytest.raises(UserInputError, match=r"'question' is missing"):
        vqa_predictor({"image": image})
    kept = vqa_predictor([{"image": image, "question": ""}, {"image": image, "question": "how many?"}], strict=False)
    assert "error" in kept[0] and "predictions" not in kept[0] and kept[1]["predictions"]


def test_precomputed_model_without_feature_weights_names_the_flag(vqa_run):
    with pytest.raises(UserInputError, match=r"--feature-weights"):
        Predictor.from_checkpoint(VQA_CFG, vqa_run["ckpt"], opts=vqa_run["opts"])


def test_answer_vocabulary_that_does_not_match_the_checkpoint(vqa_run, tmp_path):
    answers = tmp_path / "answers.txt"
    answers.write_text("\n".join(tiny_vqa.ANSWERS[:-1] + ["maybe"]) + "\n")  # same size, another answer
    opts = vqa_run["opts"] + ["DATASET.ANSWER_VOCAB_FILE", str(answers)]
    with pytest.raises(UserInputError, match=r"answers\.txt: its 7 answers are not the 7 .* line 7"):
        Predictor.from_checkpoint(VQA_CFG, vqa_run["ckpt"], opts=opts, feature_weights=vqa_run["weights"])
    answers.write_text("\n".join(tiny_vqa.ANSWERS + ["maybe"]) + "\n")
    opts = vqa_run["opts"] + ["DATASET.ANSWER_VOCAB_FILE", str(answers), "DATASET.ANSWER_VOCAB_SIZE", "8"]
    with pytest.raises(UserInputError, match=r"classifier has 7 answers, but the config's DATASET.ANSWER_VOCAB_SIZE "
                                             r"is 8"):
        Predictor.from_checkpoint(VQA_CFG, vqa_run["ckpt"], opts=opts, feature_weights=vqa_run["weights"])


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory):
    """A tiny ViT trained 2 steps on the cls demo data (scripts/make_cls_demo_data.py) and its cls/test.py CSV."""
    import csv
    import glob
    import sys

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import make_cls_demo_data
    from tests.test_cls import TINY_VIT

    root = tmp_path_factory.mktemp("predict_cls")
    data = make_cls_demo_data.write(str(root / "data"), train=15, test=10)
    cfg = os.path.join(ROOT, "cfgs", "cls", "demo_cpu.yaml")
    opts = TINY_VIT + ["DATASET.DATASET", "cifar10", "DATASET.DATASET_PATH", data, "NETWORK.NUM_CLASSES", "10",
                       "NUM_WORKERS_PER_GPU", "0", "TRAIN.END_EPOCH", "1", "TRAIN.BATCH_IMAGES", "8",
                       "VAL.BATCH_IMAGES", "5", "TEST.BATCH_IMAGES", "5", "TRAIN.WARMUP_STEPS", "1"]
    assert run_script(os.path.join(ROOT, "cls", "train_end2end.py"),
                      ["--cfg", cfg, "--model-dir", str(root), "--opts"] + opts) in (0, None)
    ckpt = glob.glob(str(root / "output" / "cls" / "demo_cpu" / "train_train" / "*-0000.model"))[0]
    assert run_script(os.path.join(ROOT, "cls", "test.py"), ["--cfg", cfg, "--ckpt", ckpt, "--result-path",
                                                              str(root / "res"), "--opts"] + opts) in (0, None)
    with open(glob.glob(str(root / "res" / "*.csv"))[0]) as f:
        rows = list(csv.DictReader(f))
    return dict(cfg=cfg, ckpt=ckpt, opts=opts, rows=rows, data=data, names=make_cls_demo_data.NAMES)


def test_cls_predictions_equal_test_py_csv_and_the_data_sets_probabilities(cls_run):
    from cls.data.datasets import CIFAR10

    predictor = Predictor.from_checkpoint(cls_run["cfg"], cls_run["ckpt"], opts=cls_run["opts"])
    test = CIFAR10(cls_run["data"], "test", None)
    results = predictor([{"image": test.images[i]} for i in range(len(test))])
    assert [r["predictions"][0]["label"] for r in results] == [row["predicted"] for row in cls_run["rows"]]
    assert ["|".join(p["label"] for p in r["predictions"]) for r in results] == [row["top5"] for row in cls_run["rows"]]
    # Class names come from the run folder's predictor.json, written by training.
    assert set(p["label"] for r in results for p in r["predictions"]) <= set(cls_run["names"])
    cfg = predictor.cfg
    model = load_for_inference(predictor.task, cfg, cls_run["ckpt"], torch.device("cpu"))

    class Probs(_Logits):
        def forward(self, model, inputs):
            return model(*inputs.without("label"))

    probs = torch.softmax(inference_on_dataset(model, make_dataloader(cfg, "test"), Probs("label_logits")), 1)
    for r, row in zip(results, probs):
        assert [p["score"] for p in r["predictions"]] == pytest.approx(
            torch.sort(row, descending=True, stable=True).values[:5].tolist(), abs=1e-6)
    _assert_same_predictions([predictor({"image": test.images[i]})[0] for i in range(3)], results[:3])


def test_a_checkpoint_of_another_task_is_named(cls_run, vqa_run):
    with pytest.raises(UserInputError, match=r"is a checkpoint of task 'cls'.* of task 'vqa'"):
        Predictor.from_checkpoint(VQA_CFG, cls_run["ckpt"], opts=vqa_run["opts"], feature_weights=vqa_run["weights"])
