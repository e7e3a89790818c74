"""``tools/export.py`` on checkpoints of tiny runs of the real entry points: the ONNX files of the cls and VQA
models give the answers ``test.py`` writes when onnxruntime runs them on the test loader's batches; the safetensors
hand-off folder holds the checkpoint's weights exactly and ``test.py`` reads it as it reads the checkpoint; the
tasks without a graph are refused by name; a runtime that drifts past 1e-4 makes the command exit 1."""
import csv
import glob
import json
import os
import re
import sys

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import yaml
from safetensors.torch import load_file

from common.engine import build_loader
from common.inference import Predictor
from tests import tiny_vqa
from tests.conftest import ROOT
from tests.tiny_vcr import run_script

sys.path.insert(0, os.path.join(ROOT, "demo"))
import make_cls_demo_data  # noqa: E402

EXPORT = os.path.join(ROOT, "tools", "export.py")
MAX_LINE = re.compile(r"^max \|onnx - eager\| = (\S+) \(tolerance 0.0001\)$", re.M)
CASE_LINE = re.compile(r"^  onnxruntime on (.*): max \|onnx - eager\| = (\S+)$", re.M)
VQA_CFG = "base_4x16G_fp32"
CLS_OPTS = ["NETWORK.ARCH", "vit_tiny_patch16_224", "NETWORK.ARCH_KWARGS",
            "[['img_size', 32], ['patch_size', 8], ['embed_dim', 24], ['depth', 1], ['num_heads', 2]]",
            "DATASET.IMAGE_SIZE", "32", "DATASET.DATASET", "cifar10", "NETWORK.NUM_CLASSES", "10",
            "NUM_WORKERS_PER_GPU", "0", "TRAIN.END_EPOCH", "1", "TRAIN.BATCH_IMAGES", "8", "VAL.BATCH_IMAGES", "4",
            "TEST.BATCH_IMAGES", "4", "TRAIN.WARMUP_STEPS", "1"]


def export(capsys, *args):
    """``python tools/export.py args...`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = run_script(EXPORT, [str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def onnx_logits(path, loader):
    """The ONNX file's first output over the loader's batches, fed by input name: one float array per item."""
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    wanted = [i.name for i in session.get_inputs()]
    rows = []
    for batch in loader:
        rows += list(session.run(None, {name: batch.field(name).numpy() for name in wanted})[0])
    return rows


def assert_answers_as_test_py(rows, names, expected):
    """The answer of each ONNX row (its argmax, a name of ``names``) is test.py's ``expected`` one, or the two are
    near-tied: ONNX's logit of test.py's answer within twice the export's tolerance (1e-4: each runtime may be off
    by that much) of ONNX's best."""
    assert len(rows) == len(expected)
    for i, (row, want) in enumerate(zip(rows, expected)):
        got = names[int(row.argmax())]
        assert got == want or row.max() - row[names.index(want)] <= 2 * 1e-4, "item {}: onnx {!r} ({}), test.py " \
            "{!r} ({})".format(i, got, row.max(), want, row[names.index(want)])


def dims(model, name):
    """Dimension names (free axes) or sizes of the graph input or output ``name``."""
    for value in list(model.graph.input) + list(model.graph.output):
        if value.name == name:
            return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
    raise KeyError(name)


@pytest.fixture(scope="module")
def vqa_run(tmp_path_factory):
    """(inputs, the run's config.yaml, its epoch-0 checkpoint) of one tiny VQA training."""
    inputs = tiny_vqa.make_inputs(tmp_path_factory.mktemp("export_vqa"))
    model_dir = tmp_path_factory.mktemp("export_vqa_run")
    code = tiny_vqa.run_entry("train_end2end.py", ["--cfg", tiny_vqa.CFGS[VQA_CFG], "--model-dir", str(model_dir),
                                                   "--opts"] + inputs.opts())
    assert code == 0
    folder = tiny_vqa.output_folder(model_dir, VQA_CFG)
    return inputs, os.path.join(folder, "config.yaml"), os.path.join(folder, "vl-bert_base_res101_vqa-0000.model")


@pytest.fixture(scope="module")
def vqa_test_answers(vqa_run, tmp_path_factory):
    """{question_id: answer} that vqa/test.py writes for the checkpoint."""
    _, cfg, ckpt = vqa_run
    return _vqa_test(cfg, ckpt, tmp_path_factory.mktemp("vqa_test"))


def _vqa_test(cfg, ckpt, folder):
    assert tiny_vqa.run_entry("test.py", ["--cfg", cfg, "--ckpt", ckpt, "--result-path", str(folder)]) == 0
    with open(glob.glob(os.path.join(str(folder), "*.json"))[0]) as f:
        return {r["question_id"]: r["answer"] for r in json.load(f)}


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory):
    """(the run's config.yaml, its checkpoint, the opts) of one tiny cls training on the demo classes."""
    root = tmp_path_factory.mktemp("export_cls")
    opts = CLS_OPTS + ["DATASET.DATASET_PATH", make_cls_demo_data.write(str(root / "data"), train=16, test=10)]
    cfg = os.path.join(ROOT, "cfgs", "cls", "demo_cpu.yaml")
    assert run_script(os.path.join(ROOT, "cls", "train_end2end.py"),
                      ["--cfg", cfg, "--model-dir", str(root), "--opts"] + opts) in (0, None)
    out = os.path.join(str(root), "output", "cls", "demo_cpu", "train_train")
    return os.path.join(out, "config.yaml"), glob.glob(os.path.join(out, "*-0000.model"))[0], opts


def test_vqa_onnx_on_region_features_answers_as_test_py(vqa_run, vqa_test_answers, tmp_path, capsys):
    from vqa.task import TASK

    inputs, cfg_path, ckpt = vqa_run
    path = str(tmp_path / "vqa.onnx")
    code, out, err = export(capsys, "--cfg", cfg_path, "--ckpt", ckpt, "--format", "onnx", "--out", path)
    assert code == 0, err
    cases = CASE_LINE.findall(out)
    assert [c[0] for c in cases] == [  # 3 inputs of other batch sizes, box counts and question lengths
        "boxes [1, 3, 2052], im_info [1, 5], question [1, 4]", "boxes [3, 5, 2052], im_info [3, 5], question [3, 9]",
        "boxes [4, 7, 2052], im_info [4, 5], question [4, 13]"]
    assert float(MAX_LINE.search(out).group(1)) == max(float(c[1]) for c in cases) <= 1e-4

    model = onnx.load(path)
    assert {o.domain: o.version for o in model.opset_import}[""] == 18
    assert [i.name for i in model.graph.input] == ["boxes", "im_info", "question"]
    assert dims(model, "boxes") == ["batch", "boxes", 2052] and dims(model, "question") == ["batch", "text"]
    assert dims(model, "label_logits")[1] == len(tiny_vqa.ANSWERS)
    vlbert = TASK.load_config(cfg_path).NETWORK.VLBERT
    assert (vlbert.max_position_embeddings, vlbert.position_padding_idx) == (128, -1)  # the tiny run's
    assert {p.key: json.loads(p.value) for p in model.metadata_props} == {
        "label_names": tiny_vqa.ANSWERS, "input_names": ["boxes", "im_info", "question"], "max_text_length": 122}

    # The test loader's batches (2, 2, 1 questions, padded boxes and questions) through onnxruntime
    cfg = TASK.load_config(cfg_path)
    loader = build_loader(TASK, cfg, "test")
    ids = loader.dataset.question_ids
    assert sorted(ids) == sorted(vqa_test_answers)
    assert_answers_as_test_py(onnx_logits(path, loader), tiny_vqa.ANSWERS, [vqa_test_answers[q] for q in ids])
    # max_text_length is the real limit: one word piece more is past the position embeddings
    session, batch = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]), next(iter(loader))
    feed = {name: batch.field(name).numpy() for name in ("boxes", "im_info")}
    for length in (122, 123):
        feed["question"] = np.full((feed["boxes"].shape[0], length), 5, dtype=np.int64)
        if length == 122:
            assert np.isfinite(session.run(None, feed)[0]).all()
        else:
            with pytest.raises(Exception, match="indices|out of bounds|index"):
                session.run(None, feed)


def test_vqa_safetensors_handoff_holds_the_checkpoint_and_test_py_reads_it(vqa_run, vqa_test_answers, tmp_path,
                                                                          capsys):
    from common.checkpoint.handoff import handoff_config
    from vqa.task import TASK

    inputs, cfg_path, ckpt = vqa_run
    folder = str(tmp_path / "handoff")
    code, out, err = export(capsys, "--cfg", cfg_path, "--ckpt", ckpt, "--format", "safetensors", "--out", folder)
    assert code == 0, err
    assert sorted(os.listdir(folder)) == ["answers.txt", "bert", "config.yaml", "model.safetensors", "predictor.json"]
    assert sorted(os.listdir(os.path.join(folder, "bert"))) == ["bert_config.json", "tokenizer_config.json", "vocab.txt"]
    weights, saved = load_file(os.path.join(folder, "model.safetensors")), torch.load(ckpt, weights_only=True)
    assert sorted(weights) == sorted(saved["state_dict"])
    for key, value in saved["state_dict"].items():
        assert torch.equal(weights[key], value.float() if value.is_floating_point() else value), key
    with open(os.path.join(folder, "answers.txt")) as f:
        assert f.read().split() == tiny_vqa.ANSWERS
    with open(os.path.join(folder, "config.yaml")) as f, open(cfg_path) as g:
        written, resolved = yaml.safe_load(f), yaml.safe_load(g)
    # the run's config, the copied files named relative to the folder, the weight-initialisation files empty
    resolved["DATASET"]["ANSWER_VOCAB_FILE"], resolved["NETWORK"]["BERT_MODEL_NAME"] = "answers.txt", "bert"
    resolved["NETWORK"].update(BERT_PRETRAINED="", IMAGE_PRETRAINED="", PARTIAL_PRETRAIN="")
    assert written == resolved
    # Read back: the answers key points at the folder's copy; test.py takes the folder as --ckpt
    assert handoff_config(folder, TASK).DATASET.ANSWER_VOCAB_FILE == os.path.join(folder, "answers.txt")
    # exact: test.py on the same fp32 weights, the same computation
    assert _vqa_test(os.path.join(folder, "config.yaml"), folder, tmp_path / "res") == vqa_test_answers


def test_cls_onnx_answers_as_test_py_and_the_handoff_holds_the_class_names(cls_run, tmp_path, capsys):
    from cls.task import TASK

    cfg_path, ckpt, opts = cls_run
    path = str(tmp_path / "cls.onnx")
    code, out, err = export(capsys, "--cfg", cfg_path, "--ckpt", ckpt, "--format", "onnx", "--out", path,
                            "--opset", 17)
    assert code == 0, err
    assert [c[0] for c in CASE_LINE.findall(out)] == ["image [1, 3, 32, 32]", "image [3, 3, 32, 32]",
                                                      "image [4, 3, 32, 32]"]
    assert float(MAX_LINE.search(out).group(1)) <= 1e-4
    model = onnx.load(path)
    assert {o.domain: o.version for o in model.opset_import}[""] == 17
    assert dims(model, "image") == ["batch", 3, 32, 32] and dims(model, "label_logits") == ["batch", 10]

    assert run_script(os.path.join(ROOT, "cls", "test.py"), ["--cfg", cfg_path, "--ckpt", ckpt, "--result-path",
                                                             str(tmp_path / "res")]) in (0, None)
    with open(glob.glob(str(tmp_path / "res" / "*.csv"))[0]) as f:
        predicted = [row["predicted"] for row in csv.DictReader(f)]
    loader = build_loader(TASK, TASK.load_config(cfg_path), "test")
    assert_answers_as_test_py(onnx_logits(path, loader), make_cls_demo_data.NAMES, predicted)

    folder = tmp_path / "handoff"
    assert export(capsys, "--cfg", cfg_path, "--ckpt", ckpt, "--format", "safetensors", "--out", folder)[0] == 0
    assert json.loads((folder / "predictor.json").read_text()) == {"classes": make_cls_demo_data.NAMES}
    # The predictor reads the folder as it reads the checkpoint
    images = [{"image": np.random.default_rng(i).integers(0, 256, (40, 30, 3), dtype=np.uint8)} for i in range(3)]
    from_ckpt = Predictor.from_checkpoint(cfg_path, ckpt)(images)
    assert Predictor.from_checkpoint(None, str(folder))(images) == from_ckpt
    assert [len(r["predictions"]) for r in from_ckpt] == [5, 5, 5]
    # ... and so does tools/predict.py, --cfg left out
    from PIL import Image
    Image.fromarray(images[0]["image"]).save(str(tmp_path / "x.png"))
    predict = os.path.join(ROOT, "tools", "predict.py")
    for name, args in (("ckpt", ["--cfg", cfg_path, "--ckpt", ckpt]), ("folder", ["--ckpt", str(folder)])):
        assert run_script(predict, args + ["--image", str(tmp_path / "x.png"), "--json",
                                           str(tmp_path / (name + ".json"))]) in (0, None)
    assert json.loads((tmp_path / "folder.json").read_text()) == json.loads((tmp_path / "ckpt.json").read_text())


def test_a_runtime_that_drifts_past_1e_4_makes_the_check_exit_1(cls_run, tmp_path, capsys, monkeypatch):
    cfg_path, ckpt, _ = cls_run
    run = onnxruntime.InferenceSession.run
    monkeypatch.setattr(onnxruntime.InferenceSession, "run",
                        lambda self, *a, **k: [np.asarray(o) + np.float32(2e-4) for o in run(self, *a, **k)])
    code, out, err = export(capsys, "--cfg", cfg_path, "--ckpt", ckpt, "--format", "onnx", "--out",
                            tmp_path / "x.onnx")
    assert code == 1
    assert abs(float(MAX_LINE.search(out).group(1)) - 2e-4) < 1e-5
    assert err.strip().splitlines()[-1] == "error: the ONNX graph differs from the eager model by more than 0.0001"


@pytest.mark.parametrize("cfg, task", [("vcr/base_q2a_4x16G_fp32.yaml", "vcr"),
                                       ("refcoco/base_gt_boxes_4x16G.yaml", "refcoco"),
                                       ("pretrain/base_prec_4x16G_fp32.yaml", "pretrain")])
def test_tasks_without_a_graph_are_refused_by_name_before_anything_loads(cfg, task, tmp_path, capsys):
    from common.task import get_task

    code, out, err = export(capsys, "--cfg", os.path.join(ROOT, "cfgs", cfg), "--ckpt", tmp_path / "none.model",
                            "--format", "onnx", "--out", tmp_path / "x.onnx")
    assert code == 2
    assert err.strip() == "error: task '{}' cannot be exported to ONNX: {}".format(task, get_task(task).onnx_refusal)
    assert not os.path.exists(tmp_path / "x.onnx")


def test_vqa_with_the_vit_encoder_on_pixels_is_refused_with_the_reason(tmp_path, capsys):
    from tests.test_vit_end2end import vit_opts
    from vqa.function.onnx import VIT_REFUSAL

    cfg = tiny_vqa.CFGS[VQA_CFG]
    code, _, err = export(capsys, "--cfg", cfg, "--ckpt", tmp_path / "none.model", "--format", "onnx", "--out",
                          tmp_path / "x.onnx", "--opts", "NETWORK.IMAGE_FEAT_PRECOMPUTED", "false",
                          *vit_opts("vqa", cfg))
    assert (code, err.strip()) == (2, "error: task 'vqa' cannot be exported to ONNX: " + VIT_REFUSAL)


def test_an_opset_below_17_is_refused(cls_run, tmp_path, capsys):
    cfg_path, ckpt, _ = cls_run
    code, _, err = export(capsys, "--cfg", cfg_path, "--ckpt", ckpt, "--format", "onnx", "--out", tmp_path / "x.onnx",
                          "--opset", 16)
    assert code == 2
    assert err.strip() == "error: --opset: expected 17 or more (SDPA attention and LayerNorm need it), got 16"


def test_vqa_onnx_on_pixels_exports_the_resnet_and_roi_align(vqa_run, tmp_path, capsys):
    """NETWORK.IMAGE_FEAT_PRECOMPUTED false: the ResNet-18 and torchvision's RoIAlign are in the graph, with the
    image's height and width free."""
    import runpy

    inputs, _, _ = vqa_run
    random_resnet_file = runpy.run_path(os.path.join(ROOT, "bench", "smoke_paper_config.py"))["random_resnet_file"]
    tiny_vqa.write_images(inputs)
    resnet = str(tmp_path / "resnet18")
    random_resnet_file(resnet, 18)
    code = tiny_vqa.run_entry("train_end2end.py", ["--cfg", tiny_vqa.CFGS[VQA_CFG], "--model-dir", str(tmp_path),
                                                   "--opts"] + inputs.opts(
        NETWORK__IMAGE_FEAT_PRECOMPUTED=False, NETWORK__IMAGE_NUM_LAYERS=18, NETWORK__IMAGE_PRETRAINED=resnet,
        NETWORK__IMAGE_PRETRAINED_EPOCH=0, NETWORK__IMAGE_C5_DILATED=False, NETWORK__IMAGE_ROI_POOLED_SIZE=4,
        SCALES=[32, 48]))
    assert code == 0
    folder = tiny_vqa.output_folder(tmp_path, VQA_CFG)
    path = str(tmp_path / "pixels.onnx")
    code, out, err = export(capsys, "--cfg", os.path.join(folder, "config.yaml"), "--ckpt",
                            os.path.join(folder, "vl-bert_base_res101_vqa-0000.model"), "--format", "onnx",
                            "--out", path)
    assert code == 0, err
    assert [c[0].split(", boxes")[0] for c in CASE_LINE.findall(out)] == [
        "image [1, 3, 64, 48]", "image [3, 3, 56, 80]", "image [4, 3, 72, 72]"]
    assert float(MAX_LINE.search(out).group(1)) <= 1e-4
    model = onnx.load(path)
    assert [i.name for i in model.graph.input] == ["image", "boxes", "im_info", "question"]
    assert dims(model, "image") == ["batch", 3, "height", "width"] and dims(model, "boxes") == ["batch", "boxes", 4]
    assert any(node.op_type == "RoiAlign" for node in model.graph.node)


def test_a_missing_checkpoint_and_a_folder_that_is_no_handoff_stop_with_one_error_line(tmp_path, capsys):
    cfg = os.path.join(ROOT, "cfgs", "cls", "demo_cpu.yaml")
    code, _, err = export(capsys, "--cfg", cfg, "--ckpt", tmp_path / "none.model", "--format", "onnx", "--out",
                          tmp_path / "x.onnx")
    assert (code, err.strip()) == (2, "error: checkpoint {} does not exist".format(tmp_path / "none.model"))
    code, _, err = export(capsys, "--ckpt", tmp_path, "--format", "safetensors", "--out", tmp_path / "out")
    assert (code, err.strip()) == (2, "error: --cfg is needed: --ckpt {} is not a hand-off folder".format(tmp_path))


def test_a_truncated_handoff_weights_file_stops_with_one_error_line(cls_run, tmp_path, capsys):
    cfg_path, ckpt, _ = cls_run
    folder = tmp_path / "handoff"
    assert export(capsys, "--cfg", cfg_path, "--ckpt", ckpt, "--format", "safetensors", "--out", folder)[0] == 0
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    code, _, err = export(capsys, "--ckpt", folder, "--format", "onnx", "--out", tmp_path / "x.onnx")
    assert code == 2
    assert err.startswith("error: {} is not a readable safetensors file (".format(weights)) and len(
        err.strip().splitlines()) == 1


# Channel statistics that differ per channel, so that a BGR/RGB or 0-255/0-1 slip changes the answers.
CLS_STATS = ["NETWORK.PIXEL_MEANS", "[90.0, 120.0, 150.0]", "NETWORK.PIXEL_STDS", "[50.0, 60.0, 70.0]"]
# torch made unimportable in a subprocess: this folder goes first on PYTHONPATH.
TORCH_BLOCKER = '''import sys


class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")


sys.meta_path.insert(0, _NoTorch())
'''


def doc_consumer():
    """The ``classify.py`` block of docs/export.md, as the page shows it."""
    with open(os.path.join(ROOT, "docs", "export.md"), encoding="utf-8") as f:
        return re.search(r"```python\n(# classify\.py.*?)```", f.read(), re.S).group(1)


def test_cls_onnx_metadata_feeds_the_docs_numpy_consumer_as_predict_py_ranks(cls_run, tmp_path, capsys):
    import subprocess
    from PIL import Image

    cfg_path, ckpt, _ = cls_run
    path = str(tmp_path / "cls.onnx")
    assert export(capsys, "--cfg", cfg_path, "--ckpt", ckpt, "--format", "onnx", "--out", path, "--opts",
                  *CLS_STATS)[0] == 0
    meta = {p.key: json.loads(p.value) for p in onnx.load(path).metadata_props}
    assert meta == {"input_size": [3, 32, 32], "interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "squash",
                    "mean": pytest.approx([150 / 255, 120 / 255, 90 / 255]),  # BGR 0-255 -> RGB 0-1
                    "std": pytest.approx([70 / 255, 60 / 255, 50 / 255]), "label_names": make_cls_demo_data.NAMES}

    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for k, (w, h) in enumerate([(40, 30), (17, 61), (100, 100), (33, 32), (320, 24), (9, 9), (64, 48), (31, 77),
                                (32, 32)]):
        ramp = np.linspace(0, 255, w * h * 3).reshape(h, w, 3)
        pixels = np.clip(ramp + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(str(photos / "p{}.{}".format(k, "jpg" if k % 2 else "png")))
    assert run_script(os.path.join(ROOT, "tools", "predict.py"),
                      ["--cfg", cfg_path, "--ckpt", ckpt, "--images", str(photos), "--json", str(tmp_path / "p.json"),
                       "--opts", *CLS_STATS]) in (0, None)
    expected = json.loads((tmp_path / "p.json").read_text())

    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "sitecustomize.py").write_text(TORCH_BLOCKER)
    (tmp_path / "classify.py").write_text(doc_consumer())
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "blocker"))
    blocked = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert "torch is blocked in this test" in blocked.stderr
    done = subprocess.run([sys.executable, str(tmp_path / "classify.py"), path] + [r["image"] for r in expected],
                          env=env, capture_output=True, text=True, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert len(got) == len(expected) == 9
    for g, e in zip(got, expected):
        for gp, ep in zip(g["predictions"], e["predictions"]):  # the same ranking, unless two scores near-tie
            tied = [p["score"] for p in e["predictions"] if p["label"] == gp["label"]]
            assert gp["label"] == ep["label"] or (tied and abs(tied[0] - ep["score"]) <= 2e-5), e["image"]
        np.testing.assert_allclose([p["score"] for p in g["predictions"]], [p["score"] for p in e["predictions"]],
                                   rtol=0, atol=1e-5)


def test_the_docs_consumer_center_crops_as_torchvision_for_a_center_crop_file(cls_run, tmp_path, capsys):
    """Our export writes ``crop_mode`` 'squash'; a file in timm's 'center' mode (``crop_pct`` 0.875, set here in
    the metadata) takes the docs consumer's other branch: its top-5 equal onnxruntime's on torchvision's
    ``Resize(int(size / crop_pct))`` + ``CenterCrop(size)`` of the same photos, probabilities within 1e-5."""
    import subprocess
    from PIL import Image
    from torchvision import transforms

    cfg_path, ckpt, _ = cls_run
    squash, path = str(tmp_path / "squash.onnx"), str(tmp_path / "center.onnx")
    assert export(capsys, "--cfg", cfg_path, "--ckpt", ckpt, "--format", "onnx", "--out", squash, "--opts",
                  *CLS_STATS)[0] == 0
    model = onnx.load(squash)
    for prop in model.metadata_props:
        prop.value = {"crop_mode": '"center"', "crop_pct": "0.875"}.get(prop.key, prop.value)
    onnx.save(model, path)
    meta = {p.key: json.loads(p.value) for p in model.metadata_props}
    rng = np.random.default_rng(1)
    photos = []
    for k, (w, h) in enumerate([(40, 30), (17, 61), (100, 100), (31, 77), (320, 24)]):  # wide, tall, odd margins
        photos.append(str(tmp_path / "c{}.png".format(k)))
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(photos[-1])
    (tmp_path / "classify.py").write_text(doc_consumer())
    done = subprocess.run([sys.executable, str(tmp_path / "classify.py"), path] + photos, capture_output=True,
                          text=True, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)

    size = meta["input_size"][1]
    prep = transforms.Compose([transforms.Resize(int(size / 0.875), transforms.InterpolationMode.BILINEAR),
                               transforms.CenterCrop(size), transforms.ToTensor(),
                               transforms.Normalize(meta["mean"], meta["std"])])
    batch = torch.stack([prep(Image.open(p).convert("RGB")) for p in photos]).numpy()
    logits, = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(
        ["label_logits"], {"image": batch})
    probs = torch.softmax(torch.from_numpy(logits), 1)
    assert len(got) == len(photos)
    for g, row in zip(got, probs):
        names = meta["label_names"]
        expected = [(names[i], row[i].item()) for i in torch.sort(row, descending=True, stable=True).indices[:5]]
        for (label, score), p in zip(expected, g["predictions"]):
            assert abs(p["score"] - score) <= 1e-5 and (p["label"] == label or abs(
                row[names.index(p["label"])].item() - score) <= 1e-5), (g["image"], p, label, score)
