"""VQA v2 end to end on CPU: the shipped configs train through vqa/train_end2end.py at tiny size,
vqa/test.py writes the EvalAI JSON (the same file from 1 and 2 ranks), vqa/val.py prints the official
accuracy (the numbers of vqa/eval.py on its predictions)."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from common.data.build import make_dataloader
from tests import tiny_vqa
from tests.tiny_vqa import CFGS, QUESTIONS, make_inputs, output_folder, run_entry
from vqa.task import TASK as VQA_TASK


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("tiny_vqa"))


@pytest.fixture(scope="module")
def trained(inputs, tmp_path_factory):
    """{config name: (model dir, exit code, captured stdout)} of one tiny training per shipped config."""
    runs = {}
    for name, cfg in CFGS.items():
        model_dir = tmp_path_factory.mktemp(name)
        code = run_entry("train_end2end.py", ["--cfg", cfg, "--model-dir", str(model_dir), "--opts"] + inputs.opts())
        runs[name] = (model_dir, code)
    return runs


def _checkpoint(model_dir, name, which="0000"):
    prefix = "vl-bert_{}_res101_vqa".format(name.split("_")[0])
    return os.path.join(output_folder(model_dir, name), "{}-{}.model".format(prefix, which))


@pytest.mark.parametrize("name", sorted(CFGS))
def test_shipped_config_trains_a_few_steps(trained, name):
    model_dir, code = trained[name]
    assert code == 0
    state = torch.load(_checkpoint(model_dir, name), map_location="cpu", weights_only=True)
    # 11 training questions (train2014 + val2014) in batches of 2: 6 micro-batches; the large config
    # accumulates 4 of them per step (its GRAD_ACCUMULATE_STEPS), the base config 1.
    assert state["train_state"]["global_step"] == {"base_4x16G_fp32": 6, "large_4x16G_fp32": 2}[name]
    log = open(next(os.path.join(output_folder(model_dir, name), n)
                    for n in os.listdir(output_folder(model_dir, name)) if n.endswith(".log"))).read()
    soft_acc = [float(v) for v in re.findall(r"Val-SoftAcc=([0-9.]+)", log)]
    assert len(soft_acc) == 1 and 0.0 <= soft_acc[0] <= 1.0
    assert re.search(r"Train-SoftAcc=[0-9.]+,\tAnsLoss=[0-9.]+", log)


def test_classifier_starts_from_the_answers_mean_word_embeddings(inputs):
    """CLASSIFIER_PRETRAINED (true in the paper configs): row a of the last classifier layer is the mean
    of the word embeddings of answer a's word pieces (<unk> is '<', 'un', '##k', '>': [UNK] x 4 here)."""
    from common.engine import build_model
    from vqa.task import TASK

    cfg = VQA_TASK.load_config(CFGS["base_4x16G_fp32"], inputs.opts())
    assert cfg.NETWORK.CLASSIFIER_PRETRAINED
    model = build_model(TASK, cfg)
    table = model.vlbert.word_embeddings.weight
    weight = model.final_mlp[-1].weight
    for row, answer in enumerate(tiny_vqa.ANSWERS):
        token = answer if answer in inputs.vocab else "[UNK]"
        torch.testing.assert_close(weight[row], table[inputs.vocab.index(token)], rtol=1e-6, atol=1e-8)


def _run(args):
    out = subprocess.run(args, cwd=tiny_vqa.ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""))
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    return out.stdout


def test_test_json_covers_every_question_once_and_two_ranks_write_the_same_file(inputs, trained, tmp_path):
    model_dir, _ = trained["base_4x16G_fp32"]
    ckpt = _checkpoint(model_dir, "base_4x16G_fp32")
    cfg = CFGS["base_4x16G_fp32"]
    common = ["--ckpt", ckpt, "--result-name", "tiny", "--opts"] + inputs.opts()
    _run([sys.executable, "vqa/test.py", "--cfg", cfg, "--result-path", str(tmp_path / "one")] + common)
    _run(["./scripts/dist_run_single.sh", "2", "vqa/test.py", cfg, str(model_dir),
          "--result-path", str(tmp_path / "two")] + common)
    one = json.loads((tmp_path / "one" / "tiny_vqa2_test2015.json").read_text())
    two = json.loads((tmp_path / "two" / "tiny_vqa2_test2015.json").read_text())
    assert [r["question_id"] for r in one] == [q[0] for q in QUESTIONS["test2015"]]
    assert all(set(r) == {"question_id", "answer"} and r["answer"] in tiny_vqa.ANSWERS for r in one)
    assert two == one


def test_predictions_keep_one_answer_per_question_when_a_sampler_repeats_items(inputs, trained):
    """A padding sampler (DistributedSampler: 5 items on 2 ranks -> 6 positions) repeats item 0; the
    result still has each question once, equal to the plain loader's."""
    from common.data.samplers import DistributedSampler
    from common.engine import load_for_inference
    from common.inference.evaluation import inference_on_dataset
    from torch.utils.data import BatchSampler, DataLoader
    from vqa.function.test import Answers
    from vqa.task import TASK

    model_dir, _ = trained["base_4x16G_fp32"]
    cfg = VQA_TASK.load_config(CFGS["base_4x16G_fp32"], inputs.opts())
    model = load_for_inference(TASK, cfg, _checkpoint(model_dir, "base_4x16G_fp32"), torch.device("cpu"))
    plain = make_dataloader(cfg, "test", dataset=TASK.build_dataset(cfg, "test"))
    order = [i for r in range(2) for i in DistributedSampler(5, 2, r, shuffle=False)]
    assert sorted(order) == [0, 0, 1, 2, 3, 4]
    padded = DataLoader(plain.dataset, batch_sampler=BatchSampler(order, 2, False), collate_fn=plain.collate_fn)
    expected = inference_on_dataset(model, plain, Answers(plain.dataset))
    assert inference_on_dataset(model, padded, Answers(plain.dataset)) == expected
    assert len(expected) == 5


def test_val_prints_the_official_accuracy_of_its_predictions(inputs, trained, tmp_path):
    model_dir, _ = trained["base_4x16G_fp32"]
    val = _run([sys.executable, "vqa/val.py", "--cfg", CFGS["base_4x16G_fp32"], "--ckpt",
                _checkpoint(model_dir, "base_4x16G_fp32"), "--result-path", str(tmp_path), "--result-name", "v",
                "--opts"] + inputs.opts())
    result = tmp_path / "v_vqa2_val2014.json"
    assert [r["question_id"] for r in json.loads(result.read_text())] == [30, 31, 32]
    official = _run([sys.executable, "vqa/eval.py", "--questions", inputs.question_file("val2014"),
                     "--annotations", inputs.annotation_file("val2014"), "--result", str(result)])
    assert "Overall Accuracy is: " in val and official.strip() in val


@pytest.mark.slow
def test_val_and_test_under_fsdp_run_sharded_and_write_the_files_of_unsharded_ranks(inputs, trained, tmp_path):
    """vqa/val.py and vqa/test.py on 2 ranks with TRAIN.STRATEGY fsdp: the model sharded (sharded forwards), and
    rank 1 runs a padding batch (5 test questions in batches of 2 give the ranks 2 and 1 batches) whose forwards
    pair with rank 0's. The files equal those of 2 unsharded ranks exactly: each group's all-gather gives back the
    checkpoint's weights bit for bit, so each forward is the same computation on the same batch."""
    model_dir, _ = trained["base_4x16G_fp32"]
    ckpt, cfg = _checkpoint(model_dir, "base_4x16G_fp32"), CFGS["base_4x16G_fp32"]
    printed = {}
    for strategy in ("ddp", "fsdp"):
        out = str(tmp_path / strategy)
        args = ["--ckpt", ckpt, "--result-path", out, "--result-name", "r", "--opts"] + inputs.opts() + [
            "TRAIN.STRATEGY", strategy]
        _run(["./scripts/dist_run_single.sh", "2", "vqa/test.py", cfg, str(model_dir)] + args)
        printed[strategy] = _run(["./scripts/dist_run_single.sh", "2", "vqa/val.py", cfg, str(model_dir)] + args)
    for name in ("r_vqa2_test2015.json", "r_vqa2_val2014.json"):
        assert (tmp_path / "fsdp" / name).read_text() == (tmp_path / "ddp" / name).read_text(), name
    accuracy = [re.search(r"Overall Accuracy is: [0-9.]+", printed[s]).group(0) for s in ("ddp", "fsdp")]
    assert accuracy[0] == accuracy[1]


def test_end_to_end_image_mode_trains_the_resnet_over_the_given_boxes(inputs, tmp_path):
    """IMAGE_FEAT_PRECOMPUTED false: the in-model ResNet reads the COCO images over the feature files'
    boxes, as in VCR. The trainable stage (res4's shortcut conv) moves; the frozen stage 1 and the stem stay
    as loaded from IMAGE_PRETRAINED (IMAGE_FROZEN_BACKBONE_STAGES [1, 2] of the shipped config)."""
    import runpy

    random_resnet_file = runpy.run_path(os.path.join(tiny_vqa.ROOT, "bench", "smoke_paper_config.py"))["random_resnet_file"]
    tiny_vqa.write_images(inputs)
    resnet = str(tmp_path / "resnet18")
    random_resnet_file(resnet, 18)
    name = "base_4x16G_fp32"
    code = run_entry("train_end2end.py", ["--cfg", CFGS[name], "--model-dir", str(tmp_path), "--opts"] + inputs.opts(
        NETWORK__IMAGE_FEAT_PRECOMPUTED=False, NETWORK__IMAGE_NUM_LAYERS=18, NETWORK__IMAGE_PRETRAINED=resnet,
        NETWORK__IMAGE_PRETRAINED_EPOCH=0, NETWORK__IMAGE_C5_DILATED=False, NETWORK__IMAGE_ROI_POOLED_SIZE=4,
        SCALES=[32, 48], TRAIN__LR=1e-2))
    assert code == 0
    state = torch.load(_checkpoint(tmp_path, name), map_location="cpu", weights_only=True)
    assert state["train_state"]["global_step"] == 6
    trained, loaded = state["state_dict"], torch.load(resnet + "-0000.model", weights_only=True)
    prefix = "image_feature_extractor.backbone."
    for key in ("conv1.weight", "layer1.0.conv1.weight"):  # stem and stage 1: frozen
        torch.testing.assert_close(trained[prefix + key], loaded[key], rtol=0, atol=0)
    # (the shortcut conv: the zero-init residual branch gets no gradient while its last BN gain is 0)
    moved = trained[prefix + "layer3.0.downsample.0.weight"] - loaded["layer3.0.downsample.0.weight"]
    assert moved.abs().max() > 1e-4  # res4 learns through RoIAlign over the given boxes


def test_a_vocabulary_size_unlike_the_answer_file_stops_before_the_model(inputs, tmp_path, capsys):
    """DATASET.ANSWER_VOCAB_SIZE sizes the classifier; the answer file decides the labels: a mismatch is
    named with both numbers and the file before anything is built or written."""
    answers = os.path.join(inputs.coco, "vqa", "answers_vqa.txt")
    code = run_entry("train_end2end.py", ["--cfg", CFGS["base_4x16G_fp32"], "--model-dir", str(tmp_path), "--opts"]
                     + inputs.opts(DATASET__ANSWER_VOCAB_SIZE=5))
    err = capsys.readouterr().err
    assert code == 2
    assert re.fullmatch(r"error: DATASET\.ANSWER_VOCAB_SIZE is 5 but the answer vocabulary {} \(DATASET\.ANSWER_VOCAB_FILE\) "
                        r"has 7 answers; set DATASET\.ANSWER_VOCAB_SIZE to 7[^\n]*\n".format(re.escape(answers)), err), err
    assert not os.path.exists(output_folder(tmp_path, "base_4x16G_fp32"))
