"""Checkpoint hooks: at epoch ends and every N optimizer steps.

Both run on every rank (the RNG states of all ranks are gathered into the file); only rank 0
writes. File names and contents: :mod:`common.checkpoint`. The TensorBoard writer is flushed
before each file is written, so the points up to a checkpoint outlive a crash after it (a resumed
run hides the later ones, see ``purge_step`` in common/engine.py).
"""
from common.checkpoint import (best_checkpoint_path, epoch_checkpoint_path, prune_step_checkpoints,
                               save_checkpoint, step_checkpoint_path)

from .base import HookBase


def _save(paths, ctx, validation_monitor, cfg):
    if ctx.writer is not None:
        ctx.writer.flush()
    save_checkpoint(paths, ctx.net, ctx.optimizer, validation_monitor=validation_monitor, scaler=ctx.scaler,
                    lr_scheduler=ctx.lr_scheduler, train_state=ctx.state, config=cfg)


class Checkpoint(HookBase):
    """Epoch-end hook: ``{prefix}-{epoch:04d}.model`` every ``frequent`` epochs (CHECKPOINT_FREQUENT),
    also written to ``{prefix}-best.model`` when this epoch is the validation monitor's best.

    Args:
        prefix: ``{output folder}/{MODEL_PREFIX}``.
        frequent (int): save after epochs ``e`` with ``(e + 1) % frequent == 0``.
        cfg: saved under ``config`` (CfgNode, dict or YAML text), or None.
        validation_monitor: its state is saved and its best epoch picks the best file (None: no best).
    """

    def __init__(self, prefix, frequent=1, cfg=None, validation_monitor=None):
        if frequent < 1:
            raise ValueError("CHECKPOINT_FREQUENT must be >= 1, got {}".format(frequent))
        self.prefix = prefix
        self.frequent = frequent
        self.cfg = cfg
        self.validation_monitor = validation_monitor

    def after_epoch(self, ctx):
        epoch, monitor = ctx.epoch, self.validation_monitor
        if (epoch + 1) % self.frequent:
            return
        paths = [epoch_checkpoint_path(self.prefix, epoch)]
        if monitor is not None and monitor.best_epoch == epoch:
            paths.append(best_checkpoint_path(self.prefix))
        _save(paths, ctx, monitor, self.cfg)


class StepCheckpoint(HookBase):
    """Hook: ``{prefix}-{epoch:04d}-b{batches:07d}.model`` every ``every_steps``
    optimizer steps (TRAIN.CHECKPOINT_STEPS; applied and skipped steps both count), keeping the
    ``keep`` newest such files (TRAIN.CHECKPOINT_KEEP).

    Saves only when a micro-batch ends an accumulation group (``ctx.step_ended``): then no partial
    gradients exist and the file resumes exactly. Runs in ``after_batch``, after the LR hook's
    ``after_step``, so the saved scheduler has taken the step.
    """

    def __init__(self, prefix, every_steps, keep=2, cfg=None, validation_monitor=None):
        if every_steps < 1 or keep < 1:
            raise ValueError("TRAIN.CHECKPOINT_STEPS and TRAIN.CHECKPOINT_KEEP must be >= 1, got {} and {}"
                             .format(every_steps, keep))
        self.prefix = prefix
        self.every_steps = every_steps
        self.keep = keep
        self.cfg = cfg
        self.validation_monitor = validation_monitor

    def after_batch(self, ctx):
        state = ctx.state
        if not ctx.step_ended or (state["global_step"] + state["skipped_steps"]) % self.every_steps:
            return
        _save(step_checkpoint_path(self.prefix, state["epoch"], state["epoch_batch"]), ctx,
              self.validation_monitor, self.cfg)
        prune_step_checkpoints(self.prefix, self.keep)


def checkpoint_hooks(prefix, cfg, validation_monitor=None):
    """The checkpoint hooks a config asks for: the epoch-end one, then the mid-epoch one when
    TRAIN.CHECKPOINT_STEPS > 0.

    Returns:
        list of hooks.
    """
    hooks = [Checkpoint(prefix, cfg.CHECKPOINT_FREQUENT, cfg, validation_monitor)]
    if cfg.TRAIN.CHECKPOINT_STEPS > 0:
        hooks.append(StepCheckpoint(prefix, cfg.TRAIN.CHECKPOINT_STEPS, cfg.TRAIN.CHECKPOINT_KEEP, cfg,
                                    validation_monitor))
    return hooks
