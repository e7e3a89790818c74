"""The predictor (common/inference/predictor.py) and tools/predict.py on tiny trained checkpoints: a prediction equals
what the task's test.py / val.py computes for the same item of a tiny data set, batching changes nothing, bad inputs
give one clear UserInputError (the script: an ``error:`` line, exit 2)."""
import json
import os

import pytest
import torch

from common.data.build import make_dataloader
from common.engine import load_for_inference
from common.errors import UserInputError
from common.inference import Predictor
from common.inference.evaluation import inference_on_dataset
from tests import tiny_vqa
from tests.conftest import ROOT
from tests.evaluators import OutputRows
from tests.golden import assert_ranking_close, close
from tests.tiny_vcr import predictor_inputs, run_script

VQA_CFG = tiny_vqa.CFGS["base_4x16G_fp32"]
# The encoder of the tiny precomputed features: a random ResNet-50 (2048-d, what VQA's reader checks) on
# small images.
FEATURE_OPTS = ["NETWORK.IMAGE_NUM_LAYERS", "50", "SCALES", "[48, 64]"]


def _assert_same_predictions(results, expected, key="predictions"):
    """The rankings of two computations of the same inputs (batched and alone, two code paths): scores within the
    tolerance of tests/golden.py, labels and indices in the same order except where near-tied scores swap them."""
    assert len(results) == len(expected)
    for i, (a, b) in enumerate(zip(results, expected)):
        assert_ranking_close([((p["label"], p["index"]), p["score"]) for p in a[key]],
                             [((p["label"], p["index"]), p["score"]) for p in b[key]], "input {}".format(i))


def _feature_folder(inputs, split):
    return os.path.join(inputs.coco, "vgbua_res101_precomputed", tiny_vqa.FEATURE_FOLDERS[split])


@pytest.fixture(scope="module")
def vqa_run(tmp_path_factory):
    """A tiny VQA model trained on features that tools/extract_features.py made from the tiny images with a
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
        assert run_script(os.path.join(ROOT, "tools", "extract_features.py"), [
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
    # The scores: the sigmoid (ANS_LOSS_TYPE bce) of the logits test.py's loop computes on the data set.
    cfg = vqa_predictor.cfg
    model = load_for_inference(vqa_predictor.task, cfg, vqa_run["ckpt"], torch.device("cpu"))
    logits = inference_on_dataset(model, make_dataloader(cfg, "test"), OutputRows("label_logits"))
    expected = torch.sigmoid(logits)
    for r, row, w in zip(results, expected, written):
        top = torch.sort(row, descending=True, stable=True)
        assert_ranking_close([((p["index"], p["label"]), p["score"]) for p in r["predictions"]],
                             [((i, tiny_vqa.ANSWERS[i]), row[i].item()) for i in top.indices[:3].tolist()], w["answer"])
        # test.py's answer: the predictor's top-1, or an answer whose score ties it
        assert close(row[tiny_vqa.ANSWERS.index(w["answer"])].item(), r["predictions"][0]["score"]), w
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
    with pytest.raises(UserInputError, match=r"'boxes' must be a list of \[x1, y1, x2, y2\] rows"):
        vqa_predictor({"image": image, "question": "what?", "boxes": [1, 2, 3, 4]})
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
    """A tiny ViT trained 2 steps on the cls demo data (demo/make_cls_demo_data.py) and its cls/test.py CSV."""
    import csv
    import glob
    import sys

    sys.path.insert(0, os.path.join(ROOT, "demo"))
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
    # Class names come from the run folder's predictor.json, written by training.
    assert set(p["label"] for r in results for p in r["predictions"]) <= set(cls_run["names"])
    cfg = predictor.cfg
    model = load_for_inference(predictor.task, cfg, cls_run["ckpt"], torch.device("cpu"))

    class Probs(OutputRows):
        def forward(self, model, inputs):
            return model(*inputs.without("label"))

    probs = torch.softmax(inference_on_dataset(model, make_dataloader(cfg, "test"), Probs("label_logits")), 1)
    names = cls_run["names"]
    for r, row, written in zip(results, probs, cls_run["rows"]):
        assert [p["score"] for p in r["predictions"]] == pytest.approx(
            torch.sort(row, descending=True, stable=True).values[:5].tolist(), abs=1e-6)
        # test.py's top-5 (names only in its CSV), scored by the data set's probabilities: the same order except
        # where near-tied probabilities swap two names
        assert written["predicted"] == written["top5"].split("|")[0]
        assert_ranking_close([(p["label"], p["score"]) for p in r["predictions"]],
                             [(n, row[names.index(n)].item()) for n in written["top5"].split("|")], written["index"])
    _assert_same_predictions([predictor({"image": test.images[i]})[0] for i in range(3)], results[:3])


def test_a_sharded_checkpoint_folder_reads_the_run_folder_beside_it(cls_run, tmp_path, capsys):
    """An FSDP run's checkpoint is a folder of DCP shards in the run folder: the predictor and tools/export.py
    take the class names from the run folder's predictor.json beside it, not from inside it."""
    import shutil

    from cls.data.datasets import CIFAR10
    from common.checkpoint.checkpointer import load_checkpoint_file
    from common.checkpoint.run_files import RUN_INFO
    from common.checkpoint.sharded import save_sharded_checkpoint

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(os.path.join(os.path.dirname(cls_run["ckpt"]), RUN_INFO), str(run))
    folder = str(run / "vit-0000.model")
    save_sharded_checkpoint(load_checkpoint_file(cls_run["ckpt"]), folder).wait()
    assert os.path.isfile(os.path.join(folder, ".metadata"))  # DCP's index: a sharded folder, not a hand-off
    test = CIFAR10(cls_run["data"], "test", None)
    inputs = [{"image": test.images[i]} for i in range(3)]
    expected = Predictor.from_checkpoint(cls_run["cfg"], cls_run["ckpt"], opts=cls_run["opts"])(inputs)
    got = Predictor.from_checkpoint(cls_run["cfg"], folder + os.sep, opts=cls_run["opts"])(inputs)
    assert {p["label"] for r in got for p in r["predictions"]} <= set(cls_run["names"])
    _assert_same_predictions(got, expected)
    capsys.readouterr()
    assert run_script(os.path.join(ROOT, "tools", "export.py"), [
        "--cfg", cls_run["cfg"], "--ckpt", folder, "--format", "safetensors", "--out", str(tmp_path / "model"),
        "--opts"] + cls_run["opts"]) in (0, None)
    with open(run / RUN_INFO) as a, open(tmp_path / "model" / RUN_INFO) as b:
        written, copied = json.load(a), json.load(b)
    assert copied == written and written["classes"] == cls_run["names"]


def test_a_checkpoint_of_another_task_is_named(cls_run, vqa_run):
    with pytest.raises(UserInputError, match=r"is a checkpoint of task 'cls'.* of task 'vqa'"):
        Predictor.from_checkpoint(VQA_CFG, cls_run["ckpt"], opts=vqa_run["opts"], feature_weights=vqa_run["weights"])


@pytest.fixture(scope="module")
def vcr_run(tmp_path_factory):
    """Tiny VCR data (the demo generator's 4 test scenes), a seeded-random checkpoint and vcr/test.py's Q2A and QA2R
    leaderboard CSVs of it (the fixture of tests/test_eval_outputs.py)."""
    import csv

    from tests.faults.vcr_data import CFG, make_tiny_vcr
    from tests.test_eval_outputs import _checkpoint
    from vcr.task import TASK

    root = tmp_path_factory.mktemp("predict_vcr")
    opts = make_tiny_vcr(str(root / "in"))
    ckpt = _checkpoint(TASK, TASK.load_config(CFG, opts), root / "vcr-0000.model")
    assert run_script(os.path.join(ROOT, "vcr", "test.py"), [
        "--a-cfg", CFG, "--a-ckpt", ckpt, "--r-cfg", CFG, "--r-ckpt", ckpt, "--result-path", str(root / "res"),
        "--result-name", "tiny", "--opts"] + opts) in (0, None)
    csvs = {}
    for task in ("Q2A", "QA2R"):
        with open(root / "res" / "tiny_test_result_{}.csv".format(task)) as f:
            csvs[task] = list(csv.DictReader(f))
    anns, inputs = predictor_inputs(opts[opts.index("DATASET.DATASET_PATH") + 1])
    return dict(cfg=CFG, ckpt=ckpt, opts=opts, csvs=csvs, inputs=inputs, anns=anns)


def _by_index(predictions):
    return [p["score"] for p in sorted(predictions, key=lambda p: p["index"])]


def test_vcr_probabilities_equal_test_py_csvs(vcr_run):
    q2a = Predictor.from_checkpoint(vcr_run["cfg"], vcr_run["ckpt"], opts=vcr_run["opts"] + ["DATASET.TASK", "Q2A"])
    inputs = [{k: v for k, v in i.items() if k != "rationales"} for i in vcr_run["inputs"]]
    results = q2a(inputs)
    assert len(results) == len(vcr_run["csvs"]["Q2A"]) == 4
    for r, row in zip(results, vcr_run["csvs"]["Q2A"]):
        expected = [float(row["answer_{}".format(i)]) for i in range(4)]
        assert _by_index(r["predictions"]) == pytest.approx(expected, abs=1e-6)
        assert close(expected[r["choice"]], max(expected))  # test.py's argmax, or a choice tied with it
    _assert_same_predictions([q2a(i)[0] for i in inputs[:3]], results[:3])

    qa2r = Predictor.from_checkpoint(vcr_run["cfg"], vcr_run["ckpt"], opts=vcr_run["opts"] + ["DATASET.TASK", "QA2R"])
    for a in range(4):
        results = qa2r([dict(i, answer_index=a) for i in vcr_run["inputs"]])
        for r, row in zip(results, vcr_run["csvs"]["QA2R"]):
            expected = [float(row["rationale_conditioned_on_a{}_{}".format(a, j)]) for j in range(4)]
            assert _by_index(r["rationale_predictions"]) == pytest.approx(expected, abs=1e-6)


def test_vcr_text_tags_name_the_boxes(vcr_run):
    """``[i]`` words in a string are VCR's box references: the same probabilities as the token list."""
    from vcr.predict import vcr_tokens

    assert vcr_tokens("is [0] next to [1,2] ?", "x", "question") == ["is", [0], "next", "to", [1, 2], "?"]
    q2a = Predictor.from_checkpoint(vcr_run["cfg"], vcr_run["ckpt"], opts=vcr_run["opts"] + ["DATASET.TASK", "Q2A"])
    listed = {k: v for k, v in vcr_run["inputs"][0].items() if k != "rationales"}
    as_text = dict(listed, question=" ".join(t if isinstance(t, str) else "[{}]".format(",".join(map(str, t)))
                                             for t in listed["question"]))
    _assert_same_predictions(q2a(as_text), q2a(listed))
    with pytest.raises(UserInputError, match=r"'answers' must be a list of 4 texts"):
        q2a(dict(listed, answers=listed["answers"][:3]))
    with pytest.raises(UserInputError, match=r"refers to object 99"):
        q2a(dict(listed, question="where is [99] ?"))


@pytest.fixture(scope="module")
def refcoco_run(tiny_vcr, tmp_path_factory):
    """The tiny RefCOCO+ data (tests/refcoco_fixture.py), a seeded-random checkpoint of the detected-regions config
    and refcoco/test.py's result JSON of its 'test' split (the fixture of tests/test_eval_outputs.py)."""
    from refcoco.task import TASK
    from tests.refcoco_fixture import write_refcoco
    from tests.test_eval_outputs import _checkpoint
    from tests.test_refcoco_end2end import CFGS, tiny_opts

    root = tmp_path_factory.mktemp("predict_refcoco")
    cfg = os.path.join(CFGS, "base_detected_regions_4x16G.yaml")
    opts = tiny_opts(tiny_vcr, write_refcoco(str(root / "in")), "")
    ckpt = _checkpoint(TASK, TASK.load_config(cfg, opts), root / "refcoco-0000.model")
    assert run_script(os.path.join(ROOT, "refcoco", "test.py"), [
        "--cfg", cfg, "--ckpt", ckpt, "--split", "test", "--result-path", str(root / "res"), "--result-name", "tiny",
        "--opts"] + opts) in (0, None)
    written = [json.load(open(os.path.join(root / "res", n))) for n in os.listdir(root / "res")][0]
    return dict(cfg=cfg, ckpt=ckpt, opts=opts, written=written)


def test_refcoco_boxes_equal_test_py_json_and_scores_the_data_sets_logits(refcoco_run):
    predictor = Predictor.from_checkpoint(refcoco_run["cfg"], refcoco_run["ckpt"], opts=refcoco_run["opts"])
    loader = make_dataloader(predictor.cfg, "test")
    dataset = loader.dataset
    # Candidates as the data set has them (original pixels, before the whole-image box the config adds).
    inputs = [{"image": item["image_fn"], "expression": " ".join(item["tokens"]),
               "boxes": dataset.candidate_boxes(i).tolist()} for i, item in enumerate(dataset.items)]
    results = predictor(inputs, topk=100)
    assert len(results) == len(refcoco_run["written"]) == 2
    for r, w in zip(results, refcoco_run["written"]):
        # The model's box (argmax of the logits), test.py's (another batch: another computation) and the first of
        # the predictions (by sigmoid) are one box, or boxes whose scores tie within the tolerance.
        tied = [p["box"] for p in r["predictions"] if close(p["score"], r["predictions"][0]["score"])]
        assert any(r["box"] == pytest.approx(b, abs=1e-4) for b in tied)
        assert any(w["box"] == pytest.approx(b, abs=1e-4) for b in tied)
    model = load_for_inference(predictor.task, predictor.cfg, refcoco_run["ckpt"], torch.device("cpu"))
    rows = []

    class Logits(OutputRows):
        def process(self, inputs, outputs):
            counts = (inputs.field("boxes")[:, :, 0] > -0.5).sum(1).tolist()  # padded rows hold -1
            rows.extend(torch.sigmoid(l[:n].float()) for l, n in zip(outputs["label_logits"], counts))

        def evaluate(self):
            return rows

    inference_on_dataset(model, loader, Logits("label_logits"))
    for r, expected in zip(results, rows):
        assert _by_index(r["predictions"]) == pytest.approx(expected.tolist(), abs=1e-6)
    three = inputs + inputs[:1]
    _assert_same_predictions(predictor(three, topk=100), [predictor(i, topk=100)[0] for i in three])


def test_pretraining_top_words_are_the_argmax_of_the_mlm_logits_through_the_data_set(tiny_pretrain, tmp_path):
    """The demo pretraining config at tiny size, seeded-random weights: the data set's item of a caption with
    [MASK] words (its random masking and region masking off) through its loader and the model gives MLM logits
    whose argmax at each [MASK] is the predictor's top word, with the probabilities of their softmax."""
    from common.data.build import build_dataset
    from common.data.multitask import dataset_configs
    from pretrain.data.conceptual_captions import load_detections
    from pretrain.predict import MASK
    from pretrain.task import TASK
    from tests import tiny_pretrain as tp
    from tests.test_eval_outputs import _checkpoint

    name = "demo_e2e_cpu.yaml"
    opts = tp.opts(name, tiny_pretrain)
    cfg = TASK.load_config(tp.cfg_path(name), opts)
    ckpt = _checkpoint(TASK, cfg, tmp_path / "pretrain-0000.model")
    predictor = Predictor.from_checkpoint(tp.cfg_path(name), ckpt, opts=opts)

    sub = dataset_configs(cfg)[0]
    dataset = build_dataset(sub, "val")
    dataset.masker.word_prob, dataset.with_mvrc = 0.0, False  # no random masking: the [MASK] words are ours
    inputs = []
    for i, record in enumerate(dataset.records):
        words = list(record.caption)
        words[1] = MASK
        words[-1] = MASK
        dataset.records[i] = record._replace(caption=words)
        inputs.append({"image": record.image, "caption": " ".join(words),
                       "boxes": load_detections(record.frcnn, with_classes=False).boxes.tolist()})
    model = load_for_inference(TASK, cfg, ckpt, torch.device("cpu"))
    mask_id = predictor.task_predictor.mask_id
    rows = []

    class MLM(OutputRows):
        def forward(self, model, inputs):
            return predictor.task_predictor.forward(model, inputs)

        def process(self, inputs, outputs):
            for text, logits in zip(inputs.field("text"), outputs["mlm_logits_wvc"]):
                rows.append(torch.softmax(logits[text == mask_id].float(), -1))

        def evaluate(self):
            return rows

    inference_on_dataset(model, make_dataloader(sub, "val", dataset=dataset), MLM("mlm_logits_wvc"))
    results = predictor(inputs, topk=3)
    assert len(results) == len(rows) == 2
    for r, probs in zip(results, rows):
        assert len(r["masks"]) == len(probs) == 2
        for top, p in zip(r["masks"], probs):
            assert close(float(p[top[0]["index"]]), float(p.max()))  # the argmax, or a word whose score ties it
            assert [t["score"] for t in top] == pytest.approx(torch.sort(p, descending=True).values[:3].tolist(),
                                                             abs=1e-6)
            assert top[0]["label"] == predictor.task_predictor.vocab[top[0]["index"]]
        assert r["filled"].count(MASK) == 0
    alone = [predictor(i, topk=3)[0] for i in inputs]
    for a, b in zip(alone, results):
        for k in range(2):
            _assert_same_predictions([{"p": a["masks"][k]}], [{"p": b["masks"][k]}], key="p")
    with pytest.raises(UserInputError, match=r"no \[MASK\] word"):
        predictor({"image": inputs[0]["image"], "caption": "a photo"})


def _predict_cli(argv, capsys):
    capsys.readouterr()
    code = run_script(os.path.join(ROOT, "tools", "predict.py"), argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_predict_py_writes_the_json_layout_and_the_table(vqa_run, vqa_predictor, tmp_path, capsys):
    question = _test_questions(vqa_run)[0]
    argv = ["--cfg", VQA_CFG, "--ckpt", vqa_run["ckpt"], "--feature-weights", vqa_run["weights"],
            "--box-source", "file", "--box-file"] + vqa_run["box_files"] + ["--topk", "3"]
    code, out, _ = _predict_cli(argv + ["--image", question["image"], "--question", question["question"], "--json",
                                        str(tmp_path / "one.json"), "--opts"] + vqa_run["opts"], capsys)
    assert code in (0, None)
    written = json.load(open(tmp_path / "one.json"))
    expected = vqa_predictor(question, topk=3)[0]
    # exact: the script runs the same one-input computation in this process (here and below), bit for bit
    assert written == [dict(expected, image=question["image"], question=question["question"])]
    assert set(written[0]) == {"image", "question", "predictions", "boxes"}
    assert set(written[0]["predictions"][0]) == {"label", "index", "score"}
    top = written[0]["predictions"][0]
    assert "{} ({:.3f})".format(top["label"], top["score"]) in out

    # A folder run with a questions file: input order kept, a bad input kept with its error, exit 2.
    folder = tmp_path / "photos"
    folder.mkdir()
    name = os.path.basename(question["image"])  # the box file finds it by its file name
    (folder / name).write_bytes(open(question["image"], "rb").read())
    (folder / "broken.jpg").write_text("not an image")
    listed = [{"image": "broken.jpg", "question": "what?"}, {"image": name, "question": question["question"]},
              {"image": name, "question": ""}]
    (tmp_path / "questions.json").write_text(json.dumps(listed))
    code, out, err = _predict_cli(argv + ["--images", str(folder), "--questions", str(tmp_path / "questions.json"),
                                          "--json", str(tmp_path / "many.json"), "--opts"] + vqa_run["opts"], capsys)
    assert code == 2
    many = json.load(open(tmp_path / "many.json"))
    assert [m["image"] for m in many] == [str(folder / e["image"]) for e in listed]
    assert "not an image" in many[0]["error"] and "predictions" not in many[0]
    assert many[1].get("predictions") == expected["predictions"], many[1]
    assert "'question' must be non-empty text" in many[2]["error"]
    assert "2 of 3 input(s) could not be read" in err
    # Without --questions: every image of the folder (sorted) with the one --question.
    code, _, err = _predict_cli(argv + ["--images", str(folder), "--question", question["question"], "--json",
                                        str(tmp_path / "all.json"), "--opts"] + vqa_run["opts"], capsys)
    every = json.load(open(tmp_path / "all.json"))
    assert code == 2 and [os.path.basename(e["image"]) for e in every] == sorted(["broken.jpg", name])
    assert every[sorted(["broken.jpg", name]).index(name)]["predictions"] == expected["predictions"]


def test_predict_py_stops_on_a_bad_file_with_one_error_line(vqa_run, tmp_path, capsys):
    code, _, err = _predict_cli(["--cfg", VQA_CFG, "--ckpt", str(tmp_path / "missing.model"), "--image", "x.jpg",
                                 "--question", "what?", "--opts"] + vqa_run["opts"], capsys)
    assert code == 2
    assert err.strip().splitlines() == ["error: checkpoint '{}' does not exist".format(tmp_path / "missing.model")]
    code, _, err = _predict_cli(["--cfg", VQA_CFG, "--ckpt", vqa_run["ckpt"], "--image", "x.jpg", "--question", "q",
                                 "--opts"] + vqa_run["opts"], capsys)
    assert code == 2 and "--feature-weights" in err and "Traceback" not in err


def test_attention_maps_of_one_input(vqa_run, vqa_predictor, tmp_path):
    import numpy as np

    question = _test_questions(vqa_run)[0]
    maps = vqa_predictor.attention(question)
    _assert_same_predictions([maps["result"]], vqa_predictor(question))  # the attention path, the plain path
    layers, heads, size, _ = maps["probs"].shape
    assert (layers, heads) == (2, 2)  # the tiny VL-BERT
    # [CLS] question [SEP] [MASK] [SEP], then the whole image and the 3 boxes, then [END]
    assert maps["tokens"][0] == "[CLS]" and maps["tokens"][-1] == "[END]" and "[MASK]" in maps["tokens"]
    assert maps["regions"][1] - maps["regions"][0] == 4 and size == maps["regions"][1] + 1
    assert np.allclose(maps["probs"].sum(-1), 1.0, atol=1e-5)
    assert maps["boxes"].tolist() == maps["result"]["boxes"]


def test_the_run_folders_feature_record_needs_no_flag(vqa_run, vqa_predictor, tmp_path):
    """What demo/run_demo_vqa.sh records next to the checkpoint (encoder config, weights, box source) stands
    for --feature-weights and --box-source."""
    import shutil

    from common.checkpoint.run_files import FEATURE_INFO

    ckpt = str(tmp_path / "vqa-0000.model")
    shutil.copy(vqa_run["ckpt"], ckpt)
    (tmp_path / FEATURE_INFO).write_text(json.dumps({
        "cfg": VQA_CFG, "opts": FEATURE_OPTS, "weights": vqa_run["weights"],
        "box_source": {"kind": "file", "box_files": vqa_run["box_files"]}}))
    recorded = Predictor.from_checkpoint(VQA_CFG, ckpt, opts=vqa_run["opts"])
    questions = _test_questions(vqa_run)
    _assert_same_predictions(recorded(questions), vqa_predictor(questions))


def test_a_photo_the_recorded_box_files_do_not_list_gets_the_recorded_fallback_with_one_warning(
        vqa_run, vqa_predictor, tmp_path, capsys):
    """Issue 39, row i: the run's recorded 'file' source lists the training photos only; a new photo gets the
    recorded grid (one warning, naming box_source= in Python and --box-source on the command line), where a
    'file' source the caller gives refuses it naming the same setting."""
    import shutil
    import warnings

    import numpy as np
    from PIL import Image

    from common.checkpoint.run_files import FEATURE_INFO

    ckpt = str(tmp_path / "vqa-0000.model")
    shutil.copy(vqa_run["ckpt"], ckpt)
    (tmp_path / FEATURE_INFO).write_text(json.dumps({
        "cfg": VQA_CFG, "opts": FEATURE_OPTS, "weights": vqa_run["weights"],
        "box_source": {"kind": "file", "box_files": vqa_run["box_files"], "fallback": {"kind": "grid",
                                                                                        "grid": "2x3"}}}))
    photos = []
    for k, (w, h) in enumerate([(50, 40), (36, 60)]):
        photos.append(str(tmp_path / "new{}.png".format(k)))
        Image.fromarray(np.random.default_rng(k).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(photos[-1])
    inputs = [{"image": p, "question": "what is it ?"} for p in photos]
    recorded = Predictor.from_checkpoint(VQA_CFG, ckpt, opts=vqa_run["opts"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = recorded(inputs + _test_questions(vqa_run)[:1])
    assert [str(w.message) for w in caught] == [
        "{}: not in the box file(s) {}, which list the photos the model was trained on; it and every other photo "
        "they do not list get the recorded boxes for new photos, grid 2x3 (another source: box_source=)".format(
            photos[0], ", ".join(vqa_run["box_files"]))]
    grid = Predictor.from_checkpoint(VQA_CFG, ckpt, opts=vqa_run["opts"], box_source={"kind": "grid", "grid": "2x3"})
    _assert_same_predictions(got[:2], grid(inputs))
    assert got[0]["boxes"] == grid(inputs[0])[0]["boxes"] and len(got[0]["boxes"]) == 1 + 6
    _assert_same_predictions(got[2:], vqa_predictor(_test_questions(vqa_run)[:1]))  # a listed photo: its boxes

    # the command line: the same answer, the warning names --box-source
    code, out, _ = _predict_cli(["--ckpt", ckpt, "--cfg", VQA_CFG, "--image", photos[0], "--question",
                                 "what is it ?", "--json", str(tmp_path / "cli.json"), "--opts"] + vqa_run["opts"],
                                capsys)
    assert code in (0, None)
    # the command line logs Python warnings (common.runtime.logs): one line
    assert [line.split("(another source: ")[1] for line in out.splitlines() if "box file" in line] == [
        "--box-source)"]
    _assert_same_predictions(json.load(open(tmp_path / "cli.json"))[:1], got[:1])  # alone vs in a batch of 3

    # a file source given by the caller has no fallback: the photo is refused, naming the interface's setting
    given = {"kind": "file", "box_files": vqa_run["box_files"]}
    with pytest.raises(UserInputError, match=r"new0\.png: no boxes for this image in the box file\(s\) .*; give its "
                       r"boxes or use box_source=\{'kind': 'grid'\}$"):
        Predictor.from_checkpoint(VQA_CFG, ckpt, opts=vqa_run["opts"], box_source=given)(inputs[0])
    code, _, err = _predict_cli(["--ckpt", ckpt, "--cfg", VQA_CFG, "--image", photos[0], "--question", "what ?",
                                 "--box-source", "file", "--box-file"] + vqa_run["box_files"] + ["--opts"]
                                + vqa_run["opts"], capsys)
    assert code == 2 and err.splitlines()[0].endswith("give its boxes or use --box-source grid")


def test_predict_py_attention_writes_the_maps(vqa_run, tmp_path, capsys):
    import numpy as np

    question = _test_questions(vqa_run)[0]
    code, out, _ = _predict_cli(["--cfg", VQA_CFG, "--ckpt", vqa_run["ckpt"], "--feature-weights", vqa_run["weights"],
                                 "--box-source", "grid", "--grid", "2x2", "--image", question["image"], "--question",
                                 question["question"], "--attention", str(tmp_path / "att"), "--opts"]
                                + vqa_run["opts"], capsys)
    assert code in (0, None)
    stem = os.path.splitext(os.path.basename(question["image"]))[0]
    probs = np.load(tmp_path / "att" / "attention_probs" / (stem + ".npy"))
    record = json.load(open(tmp_path / "att" / "attention_probs" / (stem + ".json")))
    assert probs.shape[-1] == len(record["tokens"]) and len(record["boxes"]) == 1 + 4  # whole image + 2x2 grid
    assert sorted(os.listdir(tmp_path / "att" / "maps" / stem)) == [
        "layer01_region_to_word.png", "layer01_word_to_region.png", "layer02_region_to_word.png",
        "layer02_word_to_region.png", "summary_region_to_word.png", "summary_word_to_region.png"]


def test_vcr_attention_maps_are_those_of_the_first_choice(vcr_run):
    """``attention()`` on VCR (its VL-BERT inside TimeDistributed): the first answer choice's maps, each query's
    row a distribution over the unpadded tokens, regions and [END]."""
    q2a = Predictor.from_checkpoint(vcr_run["cfg"], vcr_run["ckpt"], opts=vcr_run["opts"] + ["DATASET.TASK", "Q2A"])
    inp = {k: v for k, v in vcr_run["inputs"][0].items() if k != "rationales"}
    maps = q2a.attention(inp)
    assert maps["probs"].shape[-1] == maps["probs"].shape[-2] == len(maps["tokens"])
    assert maps["tokens"][-1] == "[END]" and maps["regions"][1] + 1 == len(maps["tokens"])
    assert abs(maps["probs"].sum(-1) - 1).max() < 1e-4
    plain = q2a(inp)[0]  # another computation (attention kept): the same choice unless two choices tie
    scores = _by_index(plain["predictions"])
    assert close(scores[maps["result"]["choice"]], scores[plain["choice"]])


# ------------------------------------------------------------------------------------------- inputs that break
# Longer than any VL-BERT's positions (the tiny ones number 128, BERT-base 512): 600 words.
LONG_TEXT = " ".join(["word"] * 600)
# Pillow refuses images over twice PIL.Image.MAX_IMAGE_PIXELS (178,956,970) before decoding: 196 Mpixels.
BOMB_SIDE = 14000


def bad_photos(folder):
    """Files users upload that are not a usable photo, written under ``folder``: ``{kind: path}`` (a 1-bit PNG of
    14000 x 14000 pixels, 24 kB on disk; text named .jpg; a 1 x 1 PNG; a 16-bit greyscale PNG of a gradient)
    and, for the 16-bit one, ``16-bit expected``: the 8-bit RGB PNG it must be read as (v / 257)."""
    import numpy as np
    from PIL import Image

    paths = {k: os.path.join(folder, n) for k, n in [("bomb", "huge scan.png"), ("text", "my notes.jpg"),
                                                     ("1x1", "pixel.png"), ("16-bit", "depth16.png"),
                                                     ("16-bit expected", "depth8.png")]}
    Image.new("1", (BOMB_SIDE, BOMB_SIDE)).save(paths["bomb"])
    with open(paths["text"], "w") as f:
        f.write("not an image")
    Image.new("RGB", (1, 1), (200, 30, 30)).save(paths["1x1"])
    ramp = np.linspace(0, 65535, 48 * 64).round().astype(np.uint16).reshape(48, 64)
    Image.fromarray(ramp).save(paths["16-bit"])
    Image.fromarray(np.repeat(np.round(ramp / 257).astype(np.uint8)[..., None], 3, -1)).save(paths["16-bit expected"])
    return paths


def test_bad_image_files_through_predict_py_are_one_line_each(cls_run, tmp_path, capsys):
    """A cls checkpoint on a folder of bad files: one error line per file naming it (exit 2); the 16-bit PNG is
    answered as its 8-bit scaling (not as a white image), the 1x1 photo is answered."""
    photos = bad_photos(str(tmp_path))
    code, out, err = _predict_cli(["--cfg", cls_run["cfg"], "--ckpt", cls_run["ckpt"], "--images", str(tmp_path),
                                   "--json", str(tmp_path / "out.json"), "--opts"] + cls_run["opts"], capsys)
    assert code == 2 and "Traceback" not in err
    by_file = {os.path.basename(r["image"]): r for r in json.load(open(tmp_path / "out.json"))}
    assert by_file["huge scan.png"]["error"] == (
        "{0}: not an image: cannot decode image '{0}': Image size (196000000 pixels) exceeds limit of 178956970 "
        "pixels (Pillow's guard, PIL.Image.MAX_IMAGE_PIXELS); resize it".format(photos["bomb"]))
    assert by_file["my notes.jpg"]["error"] == (
        "{0}: not an image: cannot decode image '{0}': not an image file Pillow can read (JPEG, PNG, ...)".format(
            photos["text"]))
    assert "BytesIO" not in err and err.count("error: ") == 2
    # the two files decode to the same pixels (exact: one decoder); their answers come from two places in the
    # folder's batches, so they are compared tie-aware
    import numpy as np
    from common.data.loading import load_image
    assert np.array_equal(np.asarray(load_image(photos["16-bit"])), np.asarray(load_image(photos["16-bit expected"])))
    _assert_same_predictions([by_file["depth16.png"]], [by_file["depth8.png"]])
    assert by_file["pixel.png"]["predictions"]


def test_text_longer_than_the_positions_is_refused_naming_the_limit(vqa_run, vqa_predictor, refcoco_run, capsys):
    """VQA and RefCOCO+ (no truncation in their data sets): the input is refused with the limit, the others of
    the call are answered; tools/predict.py says it in one line, exit 2."""
    photo = _test_questions(vqa_run)[0]["image"]
    short = {"image": photo, "question": "what color is it ?"}
    long_vqa, kept = vqa_predictor([dict(short, question=LONG_TEXT), short], strict=False)
    assert long_vqa["error"] == ("{}: the text (question) is 604 tokens with the model's marks ([CLS], [SEP], ...), "
                                 "over the 126 that NETWORK.VLBERT.max_position_embeddings 128 leaves for text; "
                                 "shorten it".format(photo))
    _assert_same_predictions([kept], vqa_predictor(short))
    with pytest.raises(UserInputError, match=r"is 604 tokens .* over the 126"):
        vqa_predictor.attention(dict(short, question=LONG_TEXT))
    # One token under the limit is answered: [CLS] question [SEP] [MASK] [SEP] = 122 words + 4 marks.
    assert vqa_predictor(dict(short, question=" ".join(["word"] * 122)))[0]["predictions"]
    with pytest.raises(UserInputError, match=r"is 127 tokens"):
        vqa_predictor(dict(short, question=" ".join(["word"] * 123)))

    refcoco = Predictor.from_checkpoint(refcoco_run["cfg"], refcoco_run["ckpt"], opts=refcoco_run["opts"])
    with pytest.raises(UserInputError, match=r"the text \(expression\) is 602 tokens .* over the 126"):
        refcoco({"image": photo, "expression": LONG_TEXT})

    code, _, err = _predict_cli(["--cfg", VQA_CFG, "--ckpt", vqa_run["ckpt"], "--feature-weights", vqa_run["weights"],
                                 "--box-source", "grid", "--grid", "2x2", "--image", photo, "--question", LONG_TEXT,
                                 "--opts"] + vqa_run["opts"], capsys)
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[0].endswith("over the 126 that NETWORK.VLBERT.max_position_embeddings 128 "
                                                "leaves for text; shorten it")


def test_vcr_through_predict_py_attention_and_a_long_question(vcr_run, tmp_path, capsys):
    """tools/predict.py --attention on a Q2A and a QA2R model writes the maps of the first choice's sequence
    (the VL-BERT inside VCR's TimeDistributed); a 600-word question is truncated as the data set does (VCR's
    DATASET.SEQ_LEN, the reference's rule) and answered."""
    import numpy as np

    inp = vcr_run["inputs"][0]
    for task in ("Q2A", "QA2R"):
        argv = ["--cfg", vcr_run["cfg"], "--ckpt", vcr_run["ckpt"], "--image", inp["image"], "--question",
                " ".join(t if isinstance(t, str) else "[{}]".format(",".join(map(str, t))) for t in inp["question"]),
                "--answers"] + [" ".join(t if isinstance(t, str) else "[0]" for t in a) for a in inp["answers"]]
        if task == "QA2R":
            argv += ["--rationales"] + [" ".join(t if isinstance(t, str) else "[0]" for t in r)
                                        for r in inp["rationales"]]
        out = tmp_path / task
        code, _, err = _predict_cli(argv + ["--box-source", "grid", "--grid", "2x2", "--attention", str(out),
                                            "--json", str(out / "out.json"), "--opts"] + vcr_run["opts"]
                                    + ["DATASET.TASK", task], capsys)
        assert code in (0, None), err
        stem = os.path.splitext(os.path.basename(inp["image"]))[0]
        probs = np.load(out / "attention_probs" / (stem + ".npy"))
        record = json.load(open(out / "attention_probs" / (stem + ".json")))
        layers = probs.shape[0]
        assert probs.shape[2:] == (len(record["tokens"]), len(record["tokens"]))
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
        assert record["tokens"][0] == "[CLS]" and record["tokens"][-1] == "[END]"
        # The regions: the boxes the prediction used (the 2x2 grid; this config adds no whole-image box).
        np.testing.assert_allclose(record["boxes"], json.load(open(out / "out.json"))[0]["boxes"], atol=1e-4)
        assert record["regions"][1] - record["regions"][0] == len(record["boxes"]) == 4
        assert len(os.listdir(out / "maps" / stem)) == 2 * layers + 2  # each layer's and the summary's 2 maps

        code, _, err = _predict_cli(argv[:argv.index("--question") + 1] + [LONG_TEXT]
                                    + argv[argv.index("--question") + 2:]
                                    + ["--box-source", "grid", "--grid", "2x2", "--json", str(out / "long.json"),
                                       "--opts"] + vcr_run["opts"] + ["DATASET.TASK", task], capsys)
        assert code in (0, None), err
        answered, = json.load(open(out / "long.json"))
        key = "predictions" if task == "Q2A" else "rationale_predictions"
        assert sum(p["score"] for p in answered[key]) == pytest.approx(1.0, abs=1e-5)


# Issue 39 §1: a hand-off folder travels. tools/predict.py runs from another working folder in a subprocess whose
# audit hook refuses to open anything under the FORBIDDEN roots (the run, its data, the BERT folder, cfgs/).
OPEN_GUARD = '''import os
import sys

_ROOTS = [os.path.realpath(p) for p in os.environ["HANDOFF_FORBIDDEN"].split(os.pathsep) if p]


def _guard(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.realpath(os.fsdecode(args[0]))
        if any(path == r or path.startswith(r + os.sep) for r in _ROOTS):
            raise PermissionError("this test forbids reading " + path)


sys.addaudithook(_guard)
'''


def _assert_close(got, expected, where="", tol=1e-6):
    """JSON-like values equal, floats within ``tol``."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(expected), where
        for k in expected:
            _assert_close(got[k], expected[k], "{}.{}".format(where, k), tol)
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected)):
            _assert_close(g, e, "{}[{}]".format(where, i), tol)
    elif isinstance(expected, float):
        assert abs(got - expected) <= tol, (where, got, expected)
    else:
        assert got == expected, (where, got, expected)


def _assert_handoff_travels(tmp_path, capsys, monkeypatch, cfg, ckpt, opts, inputs, forbidden, topk=5,
                            fresh_python=False):
    """Export ``ckpt`` with tools/export.py, move the folder elsewhere, delete the export, and check that
    ``Predictor.from_checkpoint(folder)`` (working folder elsewhere) and tools/predict.py (no --cfg / --opts /
    --feature-weights, a subprocess that may not open anything under ``forbidden``) answer ``inputs`` (images
    under tmp_path/photos) as the checkpoint does, within 1e-6; with ``fresh_python``, docs/export.md's Python
    lines too, in a fresh process under the same guard (one task's test does it: the code path is the task's
    own in the in-process check above). Returns the export's stdout."""
    import shutil
    import subprocess
    import sys

    expected = Predictor.from_checkpoint(cfg, ckpt, opts=opts)(inputs, topk=topk)
    capsys.readouterr()
    assert run_script(os.path.join(ROOT, "tools", "export.py"), [
        "--cfg", cfg, "--ckpt", ckpt, "--format", "safetensors", "--out", str(tmp_path / "export" / "model"),
        "--opts"] + list(opts)) in (0, None)
    exported = capsys.readouterr().out
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "export" / "model", elsewhere / "moved")
    shutil.rmtree(tmp_path / "export")
    monkeypatch.chdir(elsewhere)
    for got, want in zip(Predictor.from_checkpoint("moved")(inputs, topk=topk), expected):
        _assert_close(got, want)

    photos = tmp_path / "photos"
    listed = [dict(inp, image=os.path.relpath(inp["image"], photos)) for inp in inputs]
    (elsewhere / "inputs.json").write_text(json.dumps(listed))
    (tmp_path / "guard").mkdir()
    (tmp_path / "guard" / "sitecustomize.py").write_text(OPEN_GUARD)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "guard"), OMP_NUM_THREADS="1",
               HANDOFF_FORBIDDEN=os.pathsep.join(str(p) for p in forbidden + [os.path.join(ROOT, "cfgs")]))
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "predict.py"), "--ckpt", "moved", "--images",
                           str(photos), "--questions", "inputs.json", "--topk", str(topk), "--json", "out.json"],
                          cwd=str(elsewhere), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    for got, want in zip(json.load(open(elsewhere / "out.json")), expected):
        _assert_close(dict(got, image=None), dict(want, image=None))
    if fresh_python:
        _assert_docs_python_lines_answer(elsewhere, listed, photos, env, topk, expected)
    # the guard works: the original checkpoint cannot be read under it
    refused = subprocess.run([sys.executable, "-c", "open({!r}, 'rb')".format(ckpt)], env=env, capture_output=True,
                             text=True)
    assert "this test forbids reading" in refused.stderr
    return exported


def _assert_docs_python_lines_answer(elsewhere, listed, photos, env, topk, expected):
    """docs/export.md's Python lines in a fresh process: the folder alone, no task package imported by hand."""
    import subprocess
    import sys

    snippet = ("import json, sys; sys.path.insert(0, {root!r}); from common.inference import Predictor; "
               "predictor = Predictor.from_checkpoint('moved'); "
               "json.dump(predictor(json.load(open('inputs.json')), topk={topk}), open('py.json', 'w'))")
    listed_abs = [dict(inp, image=str(photos / inp["image"])) for inp in listed]
    (elsewhere / "inputs.json").write_text(json.dumps(listed_abs))
    done = subprocess.run([sys.executable, "-c", snippet.format(root=ROOT, topk=topk)], cwd=str(elsewhere), env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    for got, want in zip(json.load(open(elsewhere / "py.json")), expected):
        _assert_close(dict(got, image=None), dict(want, image=None))


def _photos(tmp_path, sizes):
    import numpy as np
    from PIL import Image

    (tmp_path / "photos").mkdir(exist_ok=True)
    paths = []
    for k, (w, h) in enumerate(sizes):
        paths.append(str(tmp_path / "photos" / "own{}.png".format(k)))
        Image.fromarray(np.random.default_rng(k).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    return paths


def _copy_photo(tmp_path, path):
    import shutil

    (tmp_path / "photos").mkdir(exist_ok=True)
    return shutil.copy(path, str(tmp_path / "photos"))


def _bert_folder(cfg_path, opts, task):
    from common.task import get_task
    return get_task(task).load_config(cfg_path, opts).NETWORK.BERT_MODEL_NAME


def test_the_vqa_handoff_of_a_precomputed_feature_model_travels(vqa_run, tmp_path, capsys, monkeypatch):
    """The image encoder, its config, the BERT vocabulary and the box source travel in the folder; the run's
    'file' box source, which lists its training photos, becomes its recorded grid, and the export says so."""
    import shutil

    from common.checkpoint.run_files import FEATURE_INFO, RUN_INFO

    run = tmp_path / "run"
    run.mkdir()
    ckpt = shutil.copy(vqa_run["ckpt"], str(run))
    shutil.copy(os.path.join(os.path.dirname(vqa_run["ckpt"]), RUN_INFO), str(run))
    (run / FEATURE_INFO).write_text(json.dumps({
        "cfg": VQA_CFG, "opts": FEATURE_OPTS, "weights": vqa_run["weights"],
        "box_source": {"kind": "file", "box_files": vqa_run["box_files"], "fallback": {"kind": "grid",
                                                                                        "grid": "2x3"}}}))
    inputs = [{"image": p, "question": q} for p, q in zip(_photos(tmp_path, [(50, 40), (36, 60), (64, 64)]),
                                                          ["what is it ?", "what color is the shape ?", "how many ?"])]
    out = _assert_handoff_travels(tmp_path, capsys, monkeypatch, VQA_CFG, ckpt, vqa_run["opts"], inputs,
                                  [str(vqa_run["root"]), str(run), _bert_folder(VQA_CFG, vqa_run["opts"], "vqa")])
    assert "note: the run's box source, the box file(s) {}, lists the photos the model was trained on; the hand-off " \
           "gives new photos its recorded fallback, grid 2x3".format(", ".join(vqa_run["box_files"])) in out
    record = json.load(open(tmp_path / "elsewhere" / "moved" / FEATURE_INFO))
    assert record == {"opts": [], "weights": "image_encoder.safetensors", "cfg": "image_encoder.yaml",
                      "box_source": {"kind": "grid", "grid": "2x3"}}


def test_the_cls_handoff_travels(cls_run, tmp_path, capsys, monkeypatch):
    inputs = [{"image": p} for p in _photos(tmp_path, [(40, 30), (17, 61), (100, 100)])]
    _assert_handoff_travels(tmp_path, capsys, monkeypatch, cls_run["cfg"], cls_run["ckpt"], cls_run["opts"], inputs,
                            [cls_run["data"], os.path.dirname(cls_run["ckpt"])])


def test_the_vcr_handoff_travels(vcr_run, tmp_path, capsys, monkeypatch):
    inputs = [dict(inp, image=_copy_photo(tmp_path, inp["image"])) for inp in vcr_run["inputs"][:2]]
    data = vcr_run["opts"][vcr_run["opts"].index("DATASET.DATASET_PATH") + 1]
    _assert_handoff_travels(tmp_path, capsys, monkeypatch, vcr_run["cfg"], vcr_run["ckpt"], vcr_run["opts"], inputs,
                            [data, os.path.dirname(vcr_run["ckpt"]),
                             _bert_folder(vcr_run["cfg"], vcr_run["opts"], "vcr")], fresh_python=True)


def test_the_refcoco_handoff_travels(refcoco_run, tmp_path, capsys, monkeypatch):
    predictor = Predictor.from_checkpoint(refcoco_run["cfg"], refcoco_run["ckpt"], opts=refcoco_run["opts"])
    dataset = make_dataloader(predictor.cfg, "test").dataset
    inputs = [{"image": _copy_photo(tmp_path, item["image_fn"]), "expression": " ".join(item["tokens"]),
               "boxes": dataset.candidate_boxes(i).tolist()} for i, item in enumerate(dataset.items)]
    _assert_handoff_travels(tmp_path, capsys, monkeypatch, refcoco_run["cfg"], refcoco_run["ckpt"],
                            refcoco_run["opts"], inputs,
                            [os.path.dirname(refcoco_run["ckpt"]), predictor.cfg.DATASET.DATASET_PATH,
                             predictor.cfg.NETWORK.BERT_MODEL_NAME])


def test_the_pretraining_handoff_travels(tiny_pretrain, tmp_path, capsys, monkeypatch):
    from pretrain.task import TASK
    from tests import tiny_pretrain as tp
    from tests.test_eval_outputs import _checkpoint

    name = "demo_e2e_cpu.yaml"
    opts = tp.opts(name, tiny_pretrain)
    cfg = TASK.load_config(tp.cfg_path(name), opts)
    (tmp_path / "run").mkdir()
    ckpt = _checkpoint(TASK, cfg, tmp_path / "run" / "pretrain-0000.model")
    inputs = [{"image": p, "caption": "a [MASK] on a [MASK] ."} for p in _photos(tmp_path, [(48, 40), (30, 50)])]
    _assert_handoff_travels(tmp_path, capsys, monkeypatch, tp.cfg_path(name), ckpt, opts, inputs,
                            [str(tmp_path / "run"), str(tiny_pretrain), cfg.NETWORK.BERT_MODEL_NAME], topk=3)
