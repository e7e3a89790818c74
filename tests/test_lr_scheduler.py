"""common.lr_scheduler: closed-form curves, through the trainer, with skipped steps."""
import logging
import warnings

import pytest
import torch

from common import amp
import math

from common.lr_scheduler import (WarmupCosineLR, WarmupLinearLR, WarmupMultiStepLR, build_lr_scheduler,
                                 updates_per_epoch)
from common.hooks.lr_scheduler import LRSchedulerHook
from common.trainer import Trainer
from vcr.task import TASK as VCR_TASK


def _cfg(**train_keys):
    cfg = VCR_TASK.load_config(None).clone()
    cfg.defrost()
    for key, value in train_keys.items():
        setattr(cfg.TRAIN, key, value)
    return cfg


def _step_closed_form(s, base, milestones, gamma, warmup_iters, warmup_factor, method):
    if s < warmup_iters:
        w = warmup_factor if method == "constant" else warmup_factor + (1 - warmup_factor) * s / warmup_iters
    else:
        w = 1.0
    return base * w * gamma ** sum(m <= s for m in milestones)


def _triangle_closed_form(s, base, warmup, total):
    if s < warmup:
        return base * s / warmup
    return base * max(0.0, (total - s) / (total - warmup))


def _cosine_closed_form(s, base, warmup, warmup_factor, total, min_ratio):
    """Linear warmup from base x warmup_factor, then cosine to base x min_ratio at update total - 1."""
    if s < warmup:
        return base * (warmup_factor + (1 - warmup_factor) * s / warmup)
    return base * (min_ratio + (1 - min_ratio) * (1 + math.cos(math.pi * (s - warmup) / (total - 1 - warmup))) / 2)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))
        self.head = torch.nn.Parameter(torch.ones(1))

    def forward(self, x, bad):
        return {}, (self.w * x).sum() + self.head.sum() + bad[0] * self.w.sum()


def _loader(n, poisoned):
    return [(torch.ones(1, 2), torch.full((1,), float("inf") if i in poisoned else 0.)) for i in range(n)]


def _lrs_of_applied_steps(cfg, n_batches, epochs, poisoned, fp16):
    model = Model()
    opt = torch.optim.SGD([{"params": [model.w], "lr": 0.1}, {"params": [model.head], "lr": 0.01}], lr=0.1)
    sched = build_lr_scheduler(cfg, opt, n_batches)
    autocast, scaler = amp.build_precision(fp16, "float16", "cpu", loss_scale=128.)
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: seen.append([g["lr"] for g in o.param_groups]) and None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer = Trainer(model, opt, _loader(n_batches, poisoned), scaler=scaler, autocast=autocast,
                          hooks=[LRSchedulerHook()], lr_scheduler=sched, logger=logging.getLogger("t"),
                          grad_accumulate_steps=cfg.TRAIN.GRAD_ACCUMULATE_STEPS)
        state = trainer.train(0, epochs)
    return seen, state


@pytest.mark.parametrize("method", ["linear", "constant"])
def test_step_schedule_matches_closed_form_with_skips(method):
    k, n, epochs = 2, 9, 4  # 5 updates per epoch (last group of 1 micro-batch)
    cfg = _cfg(LR_SCHEDULE="step", LR_STEP=(1.0, 2.5), LR_FACTOR=0.1, WARMUP=True, WARMUP_STEPS=3,
               WARMUP_FACTOR=0.25, WARMUP_METHOD=method, GRAD_ACCUMULATE_STEPS=k, END_EPOCH=epochs)
    # batch 3 is poisoned in every epoch: the group [2, 3] is skipped 4 times
    seen, state = _lrs_of_applied_steps(cfg, n, epochs, poisoned={3}, fp16=True)
    assert updates_per_epoch(n, k) == 5
    assert (state["skipped_steps"], state["global_step"], len(seen)) == (4, 16, 16)
    milestones = [5, 12]  # int(1.0 * 5), int(2.5 * 5)
    for s, lrs in enumerate(seen):
        for lr, base in zip(lrs, (0.1, 0.01)):
            assert lr == pytest.approx(_step_closed_form(s, base, milestones, 0.1, 3, 0.25, method), rel=1e-12)


def test_triangle_schedule_matches_closed_form_with_skips():
    k, n, epochs = 3, 10, 3  # 4 updates per epoch
    cfg = _cfg(LR_SCHEDULE="triangle", WARMUP=True, WARMUP_STEPS=4, GRAD_ACCUMULATE_STEPS=k, END_EPOCH=epochs)
    # groups [0, 1, 2] and [9] of every epoch are skipped (fp32: inf gradients skip too)
    seen, state = _lrs_of_applied_steps(cfg, n, epochs, poisoned={0, 9}, fp16=False)
    assert (state["skipped_steps"], len(seen)) == (6, 6)
    for s, lrs in enumerate(seen):
        for lr, base in zip(lrs, (0.1, 0.01)):
            assert lr == pytest.approx(_triangle_closed_form(s, base, 4, 12), rel=1e-12, abs=1e-15)


def test_cosine_schedule_matches_closed_form_with_skips():
    k, n, epochs = 2, 9, 4  # 5 updates per epoch: 20 in all, the last one (index 19) at LR_MIN
    cfg = _cfg(LR_SCHEDULE="cosine", LR=0.1, LR_MIN=0.025, WARMUP=True, WARMUP_STEPS=3, WARMUP_FACTOR=0.0,
               WARMUP_METHOD="linear", GRAD_ACCUMULATE_STEPS=k, END_EPOCH=epochs)
    # batch 8 (the last group, 1 micro-batch) is poisoned in every epoch: 4 skipped updates
    seen, state = _lrs_of_applied_steps(cfg, n, epochs, poisoned={8}, fp16=True)
    assert (state["skipped_steps"], len(seen)) == (4, 16)
    for s, lrs in enumerate(seen):
        for lr, base in zip(lrs, (0.1, 0.01)):  # each group ends at LR_MIN / LR = 1/4 of its base LR
            assert lr == pytest.approx(_cosine_closed_form(s, base, 3, 0.0, 20, 0.25), rel=1e-12, abs=1e-15)
    assert [lr for lr, _ in seen[:4]] == pytest.approx([0.0, 0.1 / 3, 0.2 / 3, 0.1])


def test_cosine_reaches_lr_min_at_the_last_update_and_resumes_exactly():
    cfg = _cfg(LR_SCHEDULE="cosine", LR=0.5, LR_MIN=0.05, WARMUP=True, WARMUP_STEPS=4, WARMUP_FACTOR=0.2,
               WARMUP_METHOD="linear", GRAD_ACCUMULATE_STEPS=1, END_EPOCH=3)
    total = 30  # 3 epochs x 10 updates

    def run(sched, opt, steps):
        lrs = []
        for _ in range(steps):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return lrs

    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=2.0)
    sched = build_lr_scheduler(cfg, opt, batches_per_epoch=10)
    assert isinstance(sched, WarmupCosineLR)
    first = run(sched, opt, 13)
    # resume 1: a fresh schedule and optimizer load their state dicts (as a checkpoint restores them);
    # resume 2: positioned at global step 13 (a reference checkpoint without scheduler state)
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=2.0)
    loaded = build_lr_scheduler(cfg, opt2, batches_per_epoch=10)
    opt2.load_state_dict(opt.state_dict())
    loaded.load_state_dict(sched.state_dict())
    opt3 = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=2.0)
    positioned = build_lr_scheduler(cfg, opt3, batches_per_epoch=10, begin_step=13)
    rest = run(sched, opt, total - 13)
    assert run(loaded, opt2, total - 13) == rest
    assert run(positioned, opt3, total - 13) == pytest.approx(rest, rel=1e-15)
    expected = [_cosine_closed_form(s, 2.0, 4, 0.2, total, 0.1) for s in range(total)]
    assert first + rest == pytest.approx(expected, rel=1e-12)
    assert rest[-1] == pytest.approx(0.2) and rest[-2] > 0.2  # 2.0 x LR_MIN / LR at update 29, not before
    assert first[4] == 2.0  # the cosine starts at the base LR right after the warmup


def test_begin_step_positions_the_schedule():
    cfg = _cfg(LR_SCHEDULE="triangle", WARMUP=False, BEGIN_EPOCH=2, END_EPOCH=4, GRAD_ACCUMULATE_STEPS=1)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0)
    sched = build_lr_scheduler(cfg, opt, batches_per_epoch=10)
    assert isinstance(sched, WarmupLinearLR) and sched.last_epoch == 20
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5)
    step = build_lr_scheduler(_cfg(LR_SCHEDULE="step", LR_STEP=(1.0,), WARMUP=False), opt, 10, begin_step=10)
    assert isinstance(step, WarmupMultiStepLR) and step.milestones == [10]
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)  # initial_lr kept at 1.0


def test_plateau_and_errors():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0)
    plateau = build_lr_scheduler(_cfg(LR_SCHEDULE="plateau", LR_FACTOR=0.5), opt, 10)
    assert isinstance(plateau, torch.optim.lr_scheduler.ReduceLROnPlateau)
    assert (plateau.mode, plateau.factor, plateau.patience, plateau.cooldown) == ("max", 0.5, 1, 2)
    with pytest.raises(ValueError, match="TRAIN.LR_SCHEDULE"):
        build_lr_scheduler(_cfg(LR_SCHEDULE="exponential"), opt, 10)
    with pytest.raises(ValueError, match="TRAIN.LR_MIN = 0.001 applies to TRAIN.LR_SCHEDULE 'cosine' only"):
        build_lr_scheduler(_cfg(LR_SCHEDULE="step", LR_MIN=1e-3), opt, 10)
    with pytest.raises(ValueError, match=r"TRAIN.LR_MIN: expected a number in \[0, TRAIN.LR \(0.1\)\], got 0.2"):
        build_lr_scheduler(_cfg(LR_SCHEDULE="cosine", LR=0.1, LR_MIN=0.2), opt, 10)
    with pytest.raises(ValueError, match="TRAIN.WARMUP_METHOD"):
        build_lr_scheduler(_cfg(LR_SCHEDULE="cosine", WARMUP_METHOD="exp"), opt, 10)
    with pytest.raises(ValueError, match="TRAIN.LR_STEP"):
        build_lr_scheduler(_cfg(LR_SCHEDULE="step", LR_STEP=(3.0, 1.0)), opt, 10)
    with pytest.raises(ValueError, match="TRAIN.WARMUP_METHOD"):
        build_lr_scheduler(_cfg(LR_SCHEDULE="step", WARMUP_METHOD="cosine"), opt, 10)


def test_state_dict_round_trip():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0)
    cfg = _cfg(LR_SCHEDULE="step", LR_STEP=(1.0,), WARMUP=True, WARMUP_STEPS=2)
    sched = build_lr_scheduler(cfg, opt, 4)
    for _ in range(5):
        opt.step()
        sched.step()
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0)
    sched2 = build_lr_scheduler(cfg, opt2, 4)
    sched2.load_state_dict(sched.state_dict())
    opt2.step()
    sched2.step()
    opt.step()
    sched.step()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == pytest.approx(0.1)
