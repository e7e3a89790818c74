"""LR schedules from ``TRAIN.*``: ``step``, ``triangle`` and ``cosine`` with warmup, and ``plateau``.

Schedules count optimizer updates. The trainer runs ``ceil(batches / GRAD_ACCUMULATE_STEPS)``
updates per epoch (a last short group is stepped too), so epoch boundaries in the config
(``LR_STEP``, ``END_EPOCH``) become ``epoch x updates_per_epoch`` steps. The reference computed
``int(epoch x batches / k)``; both agree when k divides the batches per epoch.

The trainer steps a schedule after each applied optimizer step, so update number ``s``
(0-based, counted over the whole run) uses ``base_lr x factor(s)``.

On resume the config's schedule is the truth, positioned at the checkpoint's ``global_step``
(:func:`resume_lr_scheduler`): a raised END_EPOCH, a new LR, LR_STEP or warmup take effect, and the
log names each schedule key that differs from the checkpoint's config.
"""
import math
from bisect import bisect_right

import torch
import yaml
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from common.runtime.logs import get_logger

SCHEDULES = ("step", "triangle", "cosine", "plateau")
WARMUP_METHODS = ("constant", "linear")


def updates_per_epoch(batches_per_epoch: int, grad_accumulate_steps: int) -> int:
    """Optimizer updates the trainer makes in an epoch of ``batches_per_epoch`` micro-batches."""
    return math.ceil(batches_per_epoch / grad_accumulate_steps)


def _check_warmup_method(method):
    if method not in WARMUP_METHODS:
        raise ValueError("TRAIN.WARMUP_METHOD: expected one of {}, got {!r}".format(WARMUP_METHODS, method))


def warmup_multiplier(step: int, warmup_iters: int, warmup_factor: float, method: str) -> float:
    """The warmup term ``w(s)`` of the 'step' and 'cosine' schedules (``TRAIN.WARMUP_*``):

        w(s) = warmup_factor                                                'constant', s < warmup_iters
             = warmup_factor * (1 - s / warmup_iters) + s / warmup_iters     'linear', s < warmup_iters
             = 1                                                            otherwise
    """
    if step >= warmup_iters:
        return 1.0
    if method == "constant":
        return warmup_factor
    alpha = step / warmup_iters
    return warmup_factor * (1 - alpha) + alpha


class _ClosedFormLR(LRScheduler):
    """A schedule given as ``factor(step)``: LR of group i = ``base_lrs[i] * factor(last_epoch)``."""

    def factor(self, step: int) -> float:
        raise NotImplementedError

    def get_lr(self):
        f = self.factor(self.last_epoch)
        return [base_lr * f for base_lr in self.base_lrs]


class _WarmupLR(_ClosedFormLR):
    """A closed-form schedule that starts with :func:`warmup_multiplier`'s warmup (``TRAIN.WARMUP*``).

    Raises:
        ValueError: unknown warmup method.
    """

    def __init__(self, optimizer, warmup_factor, warmup_iters, warmup_method, last_epoch):
        _check_warmup_method(warmup_method)
        self.warmup_factor = warmup_factor
        self.warmup_iters = warmup_iters
        self.warmup_method = warmup_method
        super().__init__(optimizer, last_epoch)


class WarmupMultiStepLR(_WarmupLR):
    """Warmup, then the LR times ``gamma`` at each milestone (maskrcnn-benchmark's schedule):

        factor(s) = w(s) * gamma ** (number of milestones <= s)      (w: :func:`warmup_multiplier`)

    Args:
        milestones: increasing optimizer-step indices.
        last_epoch: index of the last update done (-1: fresh start; ``begin_step - 1`` to start
            at ``begin_step``, which needs ``initial_lr`` in the param groups).

    Raises:
        ValueError: milestones not increasing, unknown warmup method.
    """

    def __init__(self, optimizer, milestones, gamma=0.1, warmup_factor=1.0 / 3, warmup_iters=500,
                 warmup_method="linear", last_epoch=-1):
        milestones = list(milestones)
        if milestones != sorted(milestones):
            raise ValueError("TRAIN.LR_STEP must be increasing, got milestones {}".format(milestones))
        self.milestones = milestones
        self.gamma = gamma
        super().__init__(optimizer, warmup_factor, warmup_iters, warmup_method, last_epoch)

    def factor(self, step):
        return (warmup_multiplier(step, self.warmup_iters, self.warmup_factor, self.warmup_method)
                * self.gamma ** bisect_right(self.milestones, step))


class WarmupLinearLR(_ClosedFormLR):
    """BERT's triangle: linear from 0 to 1 over ``warmup_steps``, then linear to 0 at ``total_steps``:

        factor(s) = s / max(1, warmup_steps)                                    s < warmup_steps
                  = max(0, (total_steps - s) / max(1, total_steps - warmup_steps))  otherwise
    """

    def __init__(self, optimizer, warmup_steps, total_steps, last_epoch=-1):
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        super().__init__(optimizer, last_epoch)

    def factor(self, step):
        if step < self.warmup_steps:
            return step / max(1, self.warmup_steps)
        return max(0.0, (self.total_steps - step) / max(1, self.total_steps - self.warmup_steps))


class WarmupCosineLR(_WarmupLR):
    """Warmup, then a half cosine from the base LR down to ``min_factor`` x the base LR, reached at
    the last update ``total_steps - 1`` (timm's ``CosineLRScheduler`` without restarts, in steps):

        factor(s) = w(s)                                              s < warmup_iters  (:func:`warmup_multiplier`)
                  = m + (1 - m) * (1 + cos(pi * p)) / 2               otherwise, m = min_factor,
        p = min(1, (s - warmup_iters) / max(1, total_steps - 1 - warmup_iters))

    A warmup as long as the run leaves the LR at the warmup's values; updates past ``total_steps - 1``
    keep ``m``.

    Args:
        total_steps: optimizer updates of the whole run (``END_EPOCH x updates_per_epoch``).
        min_factor: final LR / base LR, in [0, 1] (``TRAIN.LR_MIN / TRAIN.LR``).
        last_epoch: as :class:`WarmupMultiStepLR`.

    Raises:
        ValueError: unknown warmup method.
    """

    def __init__(self, optimizer, total_steps, min_factor=0.0, warmup_factor=1.0 / 3, warmup_iters=500,
                 warmup_method="linear", last_epoch=-1):
        self.total_steps = total_steps
        self.min_factor = min_factor
        super().__init__(optimizer, warmup_factor, warmup_iters, warmup_method, last_epoch)

    def factor(self, step):
        if step < self.warmup_iters:
            return warmup_multiplier(step, self.warmup_iters, self.warmup_factor, self.warmup_method)
        progress = min(1.0, (step - self.warmup_iters) / max(1, self.total_steps - 1 - self.warmup_iters))
        return self.min_factor + (1.0 - self.min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_lr_scheduler(cfg, optimizer: torch.optim.Optimizer, batches_per_epoch: int, begin_step: int = None):
    """The schedule ``TRAIN.LR_SCHEDULE`` names, positioned at ``begin_step``.

    Args:
        batches_per_epoch: ``len(train_loader)`` (micro-batches per epoch on one rank).
        begin_step: first optimizer update to run; default ``BEGIN_EPOCH x updates_per_epoch``.
            A resumed run may instead load the scheduler's state dict.

    Returns:
        ``WarmupMultiStepLR`` ('step': milestones ``int(e x updates_per_epoch)`` for e in LR_STEP,
        warmup WARMUP_STEPS if WARMUP), ``WarmupLinearLR`` ('triangle': warmup WARMUP_STEPS if
        WARMUP, zero at END_EPOCH), ``WarmupCosineLR`` ('cosine': warmup as 'step', then cosine to
        ``LR_MIN / LR`` x each group's base LR at the last update of END_EPOCH; LR_MIN is a per-sample
        LR like LR, so the default group ends at LR_MIN x images per step and LR_MULT ratios hold) or
        ``ReduceLROnPlateau`` ('plateau': the reference's settings, mode max, factor LR_FACTOR,
        patience 1, cooldown 2, rel. threshold 1e-4).

    Raises:
        ValueError: unknown ``TRAIN.LR_SCHEDULE`` / ``WARMUP_METHOD``, decreasing ``LR_STEP``,
            ``LR_MIN`` above ``LR``, or a non-zero ``LR_MIN`` with a schedule other than 'cosine'.
    """
    train = cfg.TRAIN
    per_epoch = updates_per_epoch(batches_per_epoch, train.GRAD_ACCUMULATE_STEPS)
    if begin_step is None:
        begin_step = int(train.BEGIN_EPOCH * per_epoch)
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    warmup_steps = train.WARMUP_STEPS if train.WARMUP else 0
    if train.LR_MIN != 0.0 and train.LR_SCHEDULE != "cosine":
        raise ValueError("TRAIN.LR_MIN = {} applies to TRAIN.LR_SCHEDULE 'cosine' only, got {!r}".format(
            train.LR_MIN, train.LR_SCHEDULE))
    if train.LR_SCHEDULE == "plateau":
        return ReduceLROnPlateau(optimizer, mode="max", factor=train.LR_FACTOR, patience=1, threshold=1e-4,
                                 threshold_mode="rel", cooldown=2, min_lr=0, eps=1e-8)
    if train.LR_SCHEDULE == "triangle":
        return WarmupLinearLR(optimizer, warmup_steps, total_steps=int(train.END_EPOCH * per_epoch),
                              last_epoch=begin_step - 1)
    if train.LR_SCHEDULE == "cosine":
        if train.LR_MIN > train.LR:
            raise ValueError("TRAIN.LR_MIN: expected a number in [0, TRAIN.LR ({})], got {}".format(train.LR, train.LR_MIN))
        return WarmupCosineLR(optimizer, total_steps=int(train.END_EPOCH * per_epoch),
                              min_factor=train.LR_MIN / train.LR if train.LR > 0 else 0.0,
                              warmup_factor=train.WARMUP_FACTOR, warmup_iters=warmup_steps,
                              warmup_method=train.WARMUP_METHOD, last_epoch=begin_step - 1)
    if train.LR_SCHEDULE == "step":
        return WarmupMultiStepLR(optimizer, [int(e * per_epoch) for e in train.LR_STEP], gamma=train.LR_FACTOR,
                                 warmup_factor=train.WARMUP_FACTOR, warmup_iters=warmup_steps,
                                 warmup_method=train.WARMUP_METHOD, last_epoch=begin_step - 1)
    raise ValueError("TRAIN.LR_SCHEDULE: expected one of {}, got {!r}".format(SCHEDULES, train.LR_SCHEDULE))


# TRAIN keys that shape the LR of an optimizer step (LR and BATCH_IMAGES: the base LR; END_EPOCH and
# GRAD_ACCUMULATE_STEPS: where epochs and the end fall in steps).
SCHEDULE_KEYS = ("LR", "LR_MULT", "BATCH_IMAGES", "LR_SCHEDULE", "LR_STEP", "LR_FACTOR", "LR_MIN", "WARMUP",
                 "WARMUP_METHOD", "WARMUP_FACTOR", "WARMUP_STEPS", "END_EPOCH", "GRAD_ACCUMULATE_STEPS")
# What a resumed schedule keeps of the checkpoint's: the run's progress, never its settings.
_PROGRESS = ("_step_count", "best", "num_bad_epochs", "cooldown_counter", "last_epoch")


def schedule_changes(saved_config: str, cfg) -> list:
    """``[(key, old, new)]`` for each :data:`SCHEDULE_KEYS` key of ``TRAIN`` whose value in the YAML text
    ``saved_config`` (a checkpoint's ``config``) differs from ``cfg``'s; keys the text lacks are left out."""
    from common.config import to_plain  # the config package imports this module's users

    saved = (yaml.safe_load(saved_config) or {}).get("TRAIN", {}) if saved_config else {}
    current = to_plain(cfg.TRAIN)
    return [("TRAIN." + key, saved[key], current[key]) for key in SCHEDULE_KEYS
            if key in saved and key in current and saved[key] != current[key]]


def resume_lr_scheduler(cfg, optimizer: torch.optim.Optimizer, batches_per_epoch: int, global_step: int,
                        base_lrs, restored=None, saved_config: str = None):
    """The config's schedule at optimizer step ``global_step``, after a checkpoint's optimizer state was loaded.

    Every schedule is rebuilt from ``cfg`` (:func:`build_lr_scheduler` with ``begin_step=global_step``)
    on the config's base LRs: the checkpoint's ``initial_lr`` entries are replaced by ``base_lrs``. Of the
    checkpoint's scheduler (``restored``, loaded from the file; None: the file had none) only the progress
    carries over: the plateau's best value, bad epochs and cooldown (its factor comes from the config; the
    reductions made so far scale the config's LR) and the step count. Each key of
    :func:`schedule_changes` is logged as a warning with its old and new value.

    Args:
        base_lrs: each param group's base LR as the config gives it (``initial_lr`` before loading).
        saved_config: the checkpoint's ``config`` YAML text, or None.
    Returns:
        the scheduler (see :func:`build_lr_scheduler`).
    """
    logger = get_logger("lr_scheduler")
    for key, old, new in schedule_changes(saved_config, cfg):
        logger.warning("%s changed since the checkpoint: %s -> %s; the LR schedule follows the config from "
                       "optimizer step %d", key, old, new, global_step)
    plateau = cfg.TRAIN.LR_SCHEDULE == "plateau" and isinstance(restored, ReduceLROnPlateau)
    for group, base in zip(optimizer.param_groups, base_lrs):
        if plateau and group.get("initial_lr", base) != base:
            group["lr"] = group["lr"] / group["initial_lr"] * base
        group["initial_lr"] = base
    scheduler = build_lr_scheduler(cfg, optimizer, batches_per_epoch, begin_step=global_step)
    if type(restored) is type(scheduler):
        for name in _PROGRESS:
            if hasattr(restored, name):
                setattr(scheduler, name, getattr(restored, name))
    return scheduler
