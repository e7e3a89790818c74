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

import make_cls_demo_data  # noqa: E402  (demo/ is on sys.path through tests.test_cls)

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


MIXUP = ["TRAIN.MIXUP_ALPHA", "0.8", "TRAIN.CUTMIX_ALPHA", "1.0"]


def test_mixup_with_an_odd_batch_size_stops_at_the_config(tmp_path, capsys):
    code, out = train_cls(tmp_path, 10, MIXUP + ["TRAIN.BATCH_IMAGES", "3"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "error: --opts: TRAIN.BATCH_IMAGES: expected an even int >= 1 (TRAIN.MIXUP_ALPHA 0.8, TRAIN.CUTMIX_ALPHA "
        "1.0: timm's Mixup / CutMix mixes pairs), got 3"]
    assert not os.path.exists(out)  # stopped before anything was written


def test_mixup_drops_the_odd_last_batch_of_an_epoch_with_one_log_line(tmp_path):
    """45 images at batch 8: 5 full batches per epoch, the last one (5 images) dropped; 2 epochs of 5 steps."""
    code, out = train_cls(tmp_path, 45, MIXUP + ["TRAIN.BATCH_IMAGES", "8", "TRAIN.END_EPOCH", "2",
                                                 "TRAIN.WARMUP_STEPS", "1"])
    assert code in (0, None)
    log = "".join(open(p).read() for p in glob.glob(os.path.join(out, "*.log")))
    dropped = [line for line in log.splitlines() if "dropped" in line]
    assert len(dropped) == 1, dropped
    assert dropped[0].endswith(
        "the last training batch of each epoch would hold 5 sample(s), not a multiple of 2: it is dropped (5 of 45 "
        "samples per process and epoch are not trained; timm's Mixup / CutMix (TRAIN.MIXUP_ALPHA, "
        "TRAIN.CUTMIX_ALPHA) needs an even batch)")
    state = torch.load(os.path.join(out, "vit_tiny_demo-0001.model"), map_location="cpu", weights_only=True)
    assert state["train_state"]["global_step"] == 10 and state["train_state"]["epoch"] == 2
    # LOG_FREQUENT 20: a point at batch 0 of each epoch of 5 batches (x = 5 x epoch + batch)
    assert [s for s, _ in tensorboard_scalars_in(out)["LR/Group_0"]] == [0, 5]


def _exif_rotate(path):
    """Re-save the image at ``path`` with EXIF orientation 6 (rotate 90 degrees to show it), pixels unchanged."""
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 6
    Image.open(path).save(path, exif=exif, quality=95)


def test_vcr_trains_on_an_exif_rotated_image_whose_metadata_fits_its_stored_pixels(tmp_path, tiny_vcr):
    """One training image of the tiny VCR data re-saved with EXIF orientation 6, its metadata (boxes beyond the
    upright size) made on the stored pixels: vcr/train_end2end.py trains the epoch, with one warning for it."""
    import json
    import shutil

    from tests.tiny_vcr import log_text, train_in_process

    data = str(tmp_path / "data")
    shutil.copytree(tiny_vcr.data, data)
    with open(os.path.join(data, "train.jsonl")) as f:
        items = [json.loads(line) for line in f if line.strip()]
    for item in items:
        with open(os.path.join(data, "vcr1images", item["metadata_fn"])) as f:
            meta = json.load(f)
        w, h = meta["width"], meta["height"]
        if w != h and any(b[2] > h or b[3] > w for b in meta["boxes"]):  # a box beyond the upright image
            break
    else:
        raise AssertionError("no training image with a box beyond its upright size")
    image = os.path.join(data, "vcr1images", item["img_fn"])
    _exif_rotate(image)
    code = train_in_process(tmp_path / "run", tiny_vcr.opts(DATASET__DATASET_PATH=data))
    assert code in (0, None)
    warned = [line for line in log_text(tmp_path / "run").splitlines() if "has EXIF orientation" in line]
    assert len(warned) == 1, warned
    assert "{} has EXIF orientation 6: {}x{} pixels upright, {}x{} as stored, the size in {}".format(
        image, h, w, w, h, os.path.join(data, "vcr1images", item["metadata_fn"])) in warned[0]
