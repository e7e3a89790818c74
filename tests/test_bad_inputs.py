"""Issue 30: bad inputs that used to end a run late, each tried through the real entry points.

    logged LR            TensorBoard LR/Group_0 at every step = the LR that step used (timm's CosineLRScheduler)
    Mixup, odd batches   an odd TRAIN.BATCH_IMAGES stops at the config (exit 2, the key named); an odd last
                         batch of an epoch is dropped with one log line, and the run ends with its checkpoint
    EXIF orientation     an image stored 200x120 with EXIF orientation 6 and metadata of its stored pixels
                         trains (VCR, VQA, RefCOCO+: the orientation the metadata fits, one warning per image)

Divergence: tests/faults/test_divergence.py; re-packing a zip: tests/test_lmdb.py; the data check:
tests/test_check_data.py.
"""
import glob
import os

import pytest
import torch

from tests.conftest import ROOT
from tests.test_cls import TINY_VIT
from tests.tiny_vcr import run_script, tensorboard_scalars_in

import make_cls_demo_data  # noqa: E402  (scripts/ is on sys.path through tests.test_cls)

CLS_DEMO = os.path.join(ROOT, "cfgs", "cls", "demo_cpu.yaml")


def train_cls(tmp_path, images, opts):
    """``cls/train_end2end.py`` on the demo config with a tiny ViT on ``images`` generated training images;
    returns (exit code, output folder)."""
    data = make_cls_demo_data.write(str(tmp_path / "data"), train=images, test=10)
    code = run_script(os.path.join(ROOT, "cls", "train_end2end.py"), [
        "--cfg", CLS_DEMO, "--model-dir", str(tmp_path), "--opts"] + TINY_VIT + [
        "DATASET.DATASET_PATH", data, "NUM_WORKERS_PER_GPU", "0", "TRAIN.END_EPOCH", "1", "VAL.BATCH_IMAGES", "10",
        "TRAIN.TRIVIAL_AUGMENT", "False", "TRAIN.RANDOM_ERASING_PROB", "[0.0, 0.0]"] + opts)
    return code, os.path.join(str(tmp_path), "output", "cls", "demo_cpu", "train_train")


def test_logged_lr_is_the_lr_each_step_used(tmp_path):
    """Cosine with 3 warmup steps from WARMUP_FACTOR 0.001 over 10 steps (10 images, batch 1): every
    TensorBoard point equals timm's CosineLRScheduler at that step, the warmup's start included."""
    from timm.scheduler import CosineLRScheduler

    lr, lr_min = 1e-4, 1e-6
    code, out = train_cls(tmp_path, 10, ["TRAIN.BATCH_IMAGES", "1", "TRAIN.LR", str(lr), "TRAIN.LR_MIN", str(lr_min),
                                         "TRAIN.WARMUP_STEPS", "3", "LOG_FREQUENT", "1"])
    assert code in (0, None)
    points = tensorboard_scalars_in(out)["LR/Group_0"]
    assert [s for s, _ in points] == list(range(10))
    param = torch.nn.Parameter(torch.zeros(1))
    timm_opt = torch.optim.SGD([param], lr=lr)
    timm_sched = CosineLRScheduler(timm_opt, t_initial=10 - 1 - 3, lr_min=lr_min, warmup_t=3,
                                   warmup_lr_init=lr * 0.001, warmup_prefix=True, t_in_epochs=False)
    expected = []
    for step in range(10):
        timm_sched.step_update(step)
        expected.append(timm_opt.param_groups[0]["lr"])
    assert expected[0] == pytest.approx(1e-7)  # the warmup's start: base LR x WARMUP_FACTOR
    assert [v for _, v in points] == pytest.approx(expected, rel=1e-6, abs=1e-12)
