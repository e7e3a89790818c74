"""Each training option a shipped config sets, run at tiny size through ``vcr/train_end2end.py`` and
checked by its effect (tests/tiny_vcr.py: the paper config ``base_q2a_4x16G_fp16.yaml`` made tiny).

    NETWORK.PARTIAL_PRETRAIN, _PREFIX_CHANGES, _SEGMB_INIT   the file's weights, renamed, in the model;
                                                          the rest at init; counts and names in the log
    NETWORK.LOAD_REL_HEAD                                 classifier = the relationship head's logit difference
    TRAIN.FP16, FP16_LOSS_SCALE 'dynamic'                 overflowing steps skipped, scale halved down to 128
    TRAIN.FP16, FP16_LOSS_SCALE 128                       the scale stays 128, steps applied
    TRAIN.GRAD_ACCUMULATE_STEPS                           k micro-batches of b = one batch of k x b
    TRAIN.CLIP_GRAD_NORM                                  the first SGD update has norm LR x max norm
    NETWORK.IMAGE_FROZEN_BACKBONE_STAGES, IMAGE_FROZEN_BN  frozen weights and BN statistics unchanged
    TRAIN.ASPECT_GROUPING                                 one orientation per batch
    DATASET.ZIP_MODE                                      images from the zip: the folder run's result
    TRAIN.LR_SCHEDULE step / triangle / plateau           the logged LR of every step = the closed form

TRAIN.AUTO_RESUME: tests/test_resume.py. The runs are in-process (no interpreter start-up) and
read back through their checkpoints, log file and TensorBoard events.
"""
import ast
import math
import re

import pytest
import torch

from tests.test_lr_scheduler import _step_closed_form, _triangle_closed_form
from tests.tiny_vcr import (ACCUMULATION_OPTS, SAME_SIZE_FILE, checkpoint, log_text, tensorboard_scalars,
                            train_in_process, train_recording_orientations)

PAPER_PREFIX_CHANGES = ["vlbert.mvrc_head.transform->cnn_loss_reg.0",
                        "module.vlbert.mvrc_head.transform->module.cnn_loss_reg.0",
                        "module.vlbert->module.vlbert._module", "vlbert->vlbert._module"]
ALL_STAGES_FROZEN = {"NETWORK__IMAGE_FROZEN_BACKBONE_STAGES": [1, 2, 3, 4, 5]}  # no fp16 conv backward: fast
PAPER_LR = 7e-5  # TRAIN.LR of the paper config, per sample


def train(factory, tiny_vcr, name, **changes):
    """A tiny run with ``changes`` to the options; returns its model dir."""
    model_dir = factory.mktemp(name)
    assert train_in_process(model_dir, tiny_vcr.opts(**changes)) == 0
    return model_dir


def weights(model_dir, epoch=0):
    return checkpoint(model_dir, epoch)["state_dict"]


def update_norm(after, before):
    """2-norm of the change of all floating tensors."""
    return math.sqrt(sum(float((after[k].double() - before[k].double()).pow(2).sum())
                         for k in before if before[k].is_floating_point()))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_vcr):
    """The tiny paper config as it is: one epoch, 4 SGD steps, step schedule with warmup."""
    return train(tmp_path_factory, tiny_vcr, "trained")


# --------------------------------------------------------------------------------------------- #
# Partial pretrain
# --------------------------------------------------------------------------------------------- #
def renamed_by_paper_rules(key):
    """The paper config's PARTIAL_PRETRAIN_PREFIX_CHANGES applied by hand to a ``module.`` key."""
    if key.startswith("module.vlbert.mvrc_head.transform"):
        return "cnn_loss_reg.0" + key[len("module.vlbert.mvrc_head.transform"):]
    if key.startswith("module.vlbert."):
        return "vlbert._module." + key[len("module.vlbert."):]
    return key[len("module."):]


def partial_load_counts(log):
    m = re.search(r"\[Partial Load\] \S+: (\d+) keys loaded, (\d+) keys of the file not matched, "
                  r"(\d+) model keys left at init", log)
    assert m, log[-3000:]
    return tuple(int(x) for x in m.groups())


def test_partial_pretrain_copies_renamed_weights_and_logs_counts(tmp_path_factory, tiny_vcr, tiny_init):
    model_dir = train(tmp_path_factory, tiny_vcr, "pretrain_e2e", TRAIN__LR=0.0,
                      NETWORK__PARTIAL_PRETRAIN=tiny_vcr.pretrain_e2e)
    source = torch.load(tiny_vcr.pretrain_e2e, weights_only=True)["state_dict"]
    renamed = {renamed_by_paper_rules(k): v.float() for k, v in source.items()}
    got, at_init = weights(model_dir), weights(tiny_init[0])
    loaded = sorted(set(renamed) & set(got))
    left = sorted(set(got) - set(renamed))
    unmatched = sorted(set(renamed) - set(got))
    # e2e pretraining has no relationship head and no pooler: the VCR head stays at init
    assert left == ["cnn_loss_reg.2.bias", "cnn_loss_reg.2.weight", "final_mlp.1.bias", "final_mlp.1.weight",
                    "vlbert._module.pooler.dense.bias", "vlbert._module.pooler.dense.weight"]
    tte = "vlbert._module.token_type_embeddings.weight"
    for k in loaded:
        expected = renamed[k]
        if k == tte:  # PARTIAL_PRETRAIN_SEGMB_INIT: segment 1 starts as segment 0
            expected = torch.cat([expected[:1], expected[:1], expected[2:]])
        assert torch.equal(got[k], expected), k
    for k in left:
        assert torch.equal(got[k], at_init[k]), k
    log = log_text(model_dir)
    assert partial_load_counts(log) == (len(loaded), len(unmatched), len(left))
    names = re.search(r"\[Partial Load\] non matched keys: (.*)", log).group(1)
    assert sorted(ast.literal_eval(names)) == unmatched
    assert {k.split(".predictions")[0].split(".region_cls")[0] for k in unmatched} == {
        "aux_text_visual_embedding.weight", "object_mask_word_embedding.weight", "vlbert._module.mlm_head",
        "vlbert._module.mvrc_head"}  # the pretraining heads and embeddings


def test_load_rel_head_makes_the_classifier_the_relationship_logit_difference(tmp_path_factory, tiny_vcr, tiny_init):
    model_dir = train(tmp_path_factory, tiny_vcr, "pretrain_rel", TRAIN__LR=0.0,
                      NETWORK__PARTIAL_PRETRAIN=tiny_vcr.pretrain_rel, NETWORK__LOAD_REL_HEAD=True)
    source = torch.load(tiny_vcr.pretrain_rel, weights_only=True)["state_dict"]
    got, at_init = weights(model_dir), weights(tiny_init[0])
    head = "module.vlbert.relationsip_head.caption_image_relationship."
    for suffix in ("weight", "bias"):
        w = source[head + suffix].float()
        assert torch.equal(got["final_mlp.1." + suffix], w[1:2] - w[0:1])
    left = ["cnn_loss_reg.2.bias", "cnn_loss_reg.2.weight", "vlbert._module.pooler.dense.bias",
            "vlbert._module.pooler.dense.weight"]
    for k in left:
        assert torch.equal(got[k], at_init[k]), k
    loaded, _, num_left = partial_load_counts(log_text(model_dir))
    assert (loaded, num_left) == (len(got) - len(left), len(left))


# --------------------------------------------------------------------------------------------- #
# Mixed precision
# --------------------------------------------------------------------------------------------- #
def test_fp16_dynamic_scale_halves_on_overflow_down_to_128(tmp_path_factory, tiny_vcr):
    """Pixels divided by 1e-4 stay finite in fp32 but overflow fp16: every step is skipped and the
    dynamic scale halves from 2**16 to the reference's floor of 128."""
    model_dir = train(tmp_path_factory, tiny_vcr, "fp16_dynamic", TRAIN__FP16=True, TRAIN__FP16_LOSS_SCALE="dynamic",
                      NETWORK__PIXEL_STDS=[1e-4] * 3, TRAIN__BATCH_IMAGES=1, TRAIN__GRAD_ACCUMULATE_STEPS=1,
                      **ALL_STAGES_FROZEN)
    steps = 16  # 16 items, batches of 1
    scalars = tensorboard_scalars(model_dir)
    assert scalars["Loss-Scale"] == [(i, max(2. ** 16 / 2 ** (i + 1), 128.)) for i in range(steps)]
    assert [v for _, v in scalars["Skipped-Steps"]] == list(range(1, steps + 1))
    ckpt = checkpoint(model_dir, 0)
    assert (ckpt["train_state"]["global_step"], ckpt["train_state"]["skipped_steps"]) == (0, steps)
    assert ckpt["amp"]["loss_scale"] == 128.
    assert ckpt["optimizer"]["state"] == {}  # optimizer.step() never ran


def test_fp16_fixed_scale_stays_and_trains(tmp_path_factory, tiny_vcr, tiny_init):
    model_dir = train(tmp_path_factory, tiny_vcr, "fp16_fixed", TRAIN__FP16=True, TRAIN__FP16_LOSS_SCALE=128.0,
                      DATASET__TRAIN_ANNOTATION_FILE=SAME_SIZE_FILE, **ALL_STAGES_FROZEN)
    scalars = tensorboard_scalars(model_dir)
    assert [v for _, v in scalars["Loss-Scale"]] == [128.] * 2
    assert [v for _, v in scalars["Skipped-Steps"]] == [0., 0.]
    assert all(math.isfinite(v) for _, v in scalars["Train-Loss"])
    ckpt = checkpoint(model_dir, 0)
    assert ckpt["train_state"]["global_step"] == 2 and ckpt["amp"]["loss_scale"] == 128.
    assert not torch.equal(ckpt["state_dict"]["final_mlp.1.weight"], weights(tiny_init[0])["final_mlp.1.weight"])


# --------------------------------------------------------------------------------------------- #
# Accumulation, clipping, frozen stages
# --------------------------------------------------------------------------------------------- #
def test_grad_accumulation_equals_one_bigger_batch_with_triangle_schedule(tmp_path_factory, tiny_vcr, tiny_init):
    """8 same-size items, 2 epochs: batches of 4 (k=1) and batches of 2 accumulated over k=2 make the
    same 4 steps at the same LR (LR x batch x k) and end at the same weights."""
    big = tmp_path_factory.mktemp("k1")
    assert train_in_process(big, tiny_vcr.opts(ACCUMULATION_OPTS, TRAIN__BATCH_IMAGES=4,
                                               TRAIN__GRAD_ACCUMULATE_STEPS=1)) == 0
    accumulated = tmp_path_factory.mktemp("k2")
    assert train_in_process(accumulated, tiny_vcr.opts(ACCUMULATION_OPTS, TRAIN__BATCH_IMAGES=2,
                                                       TRAIN__GRAD_ACCUMULATE_STEPS=2)) == 0
    at_init = weights(tiny_init[0])
    a, b = weights(big, 1), weights(accumulated, 1)
    assert checkpoint(accumulated, 1)["train_state"]["global_step"] == 4
    moved = update_norm(a, at_init)
    assert moved > 1e-4
    assert update_norm(a, b) < 1e-4 * moved
    # triangle: linear warmup over WARMUP_STEPS = 2, then linear to 0 at END_EPOCH (4 steps)
    base = PAPER_LR * 2 * 2
    lrs = tensorboard_scalars(accumulated)["LR/Group_0"]
    assert [s for s, _ in lrs] == [1, 3, 5, 7]  # x: the micro-batch that ended each step (4 per epoch)
    # each point is the LR its step used: step 0 of the warmup at 0
    assert [v for _, v in lrs] == pytest.approx([_triangle_closed_form(s, base, 2, 4) for s in range(4)])


def test_clip_grad_norm_bounds_the_update(tmp_path_factory, tiny_vcr, tiny_init):
    """One SGD step (8 items, k = 4, no warmup, no weight decay): momentum is still empty, so the update
    is LR x the clipped gradient, of norm LR x CLIP_GRAD_NORM (LR_STEP after the step: no decay)."""
    clip, lr = 0.01, 1.0
    model_dir = train(tmp_path_factory, tiny_vcr, "clip", DATASET__TRAIN_ANNOTATION_FILE=SAME_SIZE_FILE,
                      TRAIN__GRAD_ACCUMULATE_STEPS=4, TRAIN__WARMUP=False, TRAIN__WD=0.0, TRAIN__LR=lr,
                      TRAIN__LR_STEP="1", TRAIN__CLIP_GRAD_NORM=clip)
    (_, norm), = tensorboard_scalars(model_dir)["grad-para/Total-Norm"]
    assert norm > 10 * clip  # the gradient was clipped
    base_lr = lr * 2 * 4
    assert update_norm(weights(model_dir), weights(tiny_init[0])) == pytest.approx(base_lr * clip, rel=1e-3)


def test_frozen_stages_and_frozen_bn_stay_at_init(trained, tiny_init):
    """Paper config: IMAGE_FROZEN_BACKBONE_STAGES [1, 2] (stem, res2) and IMAGE_FROZEN_BN."""
    got, at_init = weights(trained), weights(tiny_init[0])
    frozen = [k for k in got if k.startswith(("image_feature_extractor.backbone.conv1",
                                              "image_feature_extractor.backbone.bn1",
                                              "image_feature_extractor.backbone.layer1."))]
    bn_stats = [k for k in got if k.endswith(("running_mean", "running_var"))]
    assert len(frozen) > 20 and len(bn_stats) > 20
    for k in frozen + bn_stats:
        assert torch.equal(got[k], at_init[k]), k
    # res3 trains (its residual convs get no gradient: zero-init residual gains under frozen BN)
    trained_conv = "image_feature_extractor.backbone.layer2.0.downsample.0.weight"
    assert not torch.equal(got[trained_conv], at_init[trained_conv])


# --------------------------------------------------------------------------------------------- #
# Data options
# --------------------------------------------------------------------------------------------- #
def test_zip_mode_reads_the_images_from_the_zip(tmp_path_factory, tiny_vcr, trained):
    """The zip-only data folder has no image folder: the run equals the folder run, bit for bit."""
    model_dir = train(tmp_path_factory, tiny_vcr, "zip", DATASET__DATASET_PATH=tiny_vcr.zip_data,
                      DATASET__ZIP_MODE=True)
    a, b = weights(model_dir), weights(trained)
    # exact: the same bytes decoded to the same images, one computation reproducing itself
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------------------------- #
# Schedules, aspect grouping
# --------------------------------------------------------------------------------------------- #
def test_step_schedule_with_warmup(trained):
    """Paper: linear warmup from WARMUP_FACTOR 0 over WARMUP_STEPS (2 here), x LR_FACTOR at LR_STEP
    (epoch 0.5 here = step 2)."""
    base = PAPER_LR * 2 * 2
    lrs = tensorboard_scalars(trained)["LR/Group_0"]
    assert [s for s, _ in lrs] == [1, 3, 5, 7]
    expected = [_step_closed_form(s, base, [2], 0.1, 2, 0.0, "linear") for s in range(4)]
    assert [v for _, v in lrs] == pytest.approx(expected)  # each point: the LR its step used
    assert expected[:3] == pytest.approx([0.0, base / 2, base / 10])


def test_plateau_schedule_and_aspect_grouping(tmp_path_factory, tiny_vcr, tiny_init):
    """4 epochs whose updates are clipped to nothing (CLIP_GRAD_NORM 1e-20, no weight decay): the
    validation accuracy stays, so 'plateau' (the reference's patience 1) lowers the LR by LR_FACTOR
    after the third epoch. Aspect grouping: every batch holds images of one orientation (the same
    data without grouping mixes them)."""
    model_dir = tmp_path_factory.mktemp("plateau")
    code, batches = train_recording_orientations(model_dir, tiny_vcr.opts(
        TRAIN__ASPECT_GROUPING=True, TRAIN__LR_SCHEDULE="plateau", TRAIN__END_EPOCH=4, TRAIN__CLIP_GRAD_NORM=1e-20,
        TRAIN__WD=0.0))
    assert code == 0
    scalars = tensorboard_scalars(model_dir)
    assert len(scalars["Val-Acc"]) == 4 and len({v for _, v in scalars["Val-Acc"]}) == 1
    base = PAPER_LR * 2 * 2
    lrs = [v for _, v in scalars["LR/Group_0"]]
    assert lrs == pytest.approx([base] * 12 + [base * 0.1] * 4, rel=1e-6)
    assert len(batches) == 4 * 8 and all(len(set(b)) == 1 for b in batches)
    assert {b[0] for b in batches} == {0, 1}
    assert any(len(set(b)) == 2 for b in tiny_init[1])
