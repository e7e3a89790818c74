"""Resuming a finished run with a changed schedule (END_EPOCH raised, a new LR, new LR_STEP milestones): the
config's schedule holds from the checkpoint's optimizer step on, and the log names each changed key.

The runs are in fp32 (no skipped steps), so the optimizer step of each micro-batch is the same in the
resumed run and in a fresh run of the new config, and their logged LRs must be equal.
"""
import glob
import os

import pytest

from common.diagnostics.tb_events import read_scalars
from tests.faults import harness

FP32 = ["TRAIN.FP16", "False"]
BATCHES = 16  # micro-batches per epoch (64 samples / 4); k = 2: 8 optimizer steps per epoch, the LR logged at each


def lrs(model_dir, first_epoch):
    """{TensorBoard x: LR of param group 0} from epoch ``first_epoch`` on (logged at the micro-batches that end a step)."""
    points = read_scalars(os.path.join(harness.out_dir(model_dir), "tensorboard_logs"))["LR/Group_0"]
    return {x: v for x, v in points if x >= first_epoch * BATCHES}


def log_text(model_dir):
    return "".join(open(p).read() for p in glob.glob(os.path.join(harness.out_dir(model_dir), "*.log")))


@pytest.mark.parametrize("schedule, changes, epoch3_lr, logged", [
    # base LR = LR x 8 images per step; 'step' with LR_STEP [1, 3], LR_FACTOR 0.5: epoch 3 at 0.1 x 8 x 0.25
    ("step", ["TRAIN.LR", "0.1", "TRAIN.LR_STEP", "[1, 3]"], [0.2] * 8,
     ["TRAIN.LR changed since the checkpoint: 0.05 -> 0.1",
      "TRAIN.LR_STEP changed since the checkpoint: [1.0, 2.0] -> [1.0, 3.0]"]),
    # 'triangle' (no warmup) reaches 0 at the end of END_EPOCH: with END_EPOCH 4, step s of 32 has
    # 0.4 x (32 - s) / 32; the LR logged at step s is the one step s used
    ("triangle", [], [0.4 * (32 - s) / 32 for s in range(24, 32)], []),
])
def test_raised_end_epoch_and_new_lr_follow_the_config(tiny_cfg, tmp_path, schedule, changes, epoch3_lr, logged):
    base = FP32 + ["TRAIN.LR_SCHEDULE", schedule]
    new = base + ["TRAIN.END_EPOCH", "4"] + changes
    work, fresh = tmp_path / "work", tmp_path / "fresh"
    assert harness.run_here(tiny_cfg, work, opts=base) == 0
    assert harness.run_here(tiny_cfg, work, opts=new) == 0
    assert harness.run_here(tiny_cfg, fresh, opts=new) == 0

    resumed = lrs(work, 3)
    assert sorted(resumed) == list(range(3 * BATCHES + 1, 4 * BATCHES, 2))
    assert resumed == lrs(fresh, 3)
    assert [resumed[x] for x in sorted(resumed)] == pytest.approx(epoch3_lr, rel=1e-6)
    log = log_text(work)
    assert "Resumed from" in log
    for line in logged + ["TRAIN.END_EPOCH changed since the checkpoint: 3 -> 4; the LR schedule follows the "
                          "config from optimizer step 24"]:
        assert line in log
