"""Checkpoint hooks: at epoch ends and every N optimizer steps (detectron2's ``PeriodicCheckpointer`` role).

The hooks decide when and under which name; what a file holds is the
:class:`common.checkpoint.checkpointer.Checkpointer`'s.
Both run on every rank (the RNG states of all ranks are gathered into the file); only rank 0 writes.
The TensorBoard writer is flushed before each file is written, so the points up to a checkpoint outlive a
crash after it (a resumed run hides the later ones, see ``purge_step`` in common/engine.py).
"""
from common.checkpoint.checkpointer import (best_checkpoint_path, epoch_checkpoint_path, prune_step_checkpoints,
                               step_checkpoint_path)
from common.checkpoint.train_state import tried_steps
from common.runtime import distributed as cdist
from common.runtime.logs import get_logger
from common.runtime.preemption import PREEMPTED_EXIT_CODE, Preempted

from .base import HookBase


def _save(checkpointer, paths, ctx):
    if ctx.writer is not None:
        ctx.writer.flush()
    checkpointer.save(paths, ctx.state)


class Checkpoint(HookBase):
    """Epoch-end hook: ``{prefix}-{epoch:04d}.model`` every ``frequent`` epochs (CHECKPOINT_FREQUENT),
    also written to ``{prefix}-best.model`` when this epoch is the validation monitor's best.

    Args:
        checkpointer: :class:`common.checkpoint.checkpointer.Checkpointer` (its ``prefix``; its validation monitor's
        best
            epoch picks the best file, none: no best file).
        frequent (int): save after epochs ``e`` with ``(e + 1) % frequent == 0``.
    """

    def __init__(self, checkpointer, frequent=1):
        if frequent < 1:
            raise ValueError("CHECKPOINT_FREQUENT must be >= 1, got {}".format(frequent))
        self.checkpointer = checkpointer
        self.frequent = frequent

    def after_epoch(self, ctx):
        epoch, monitor, prefix = ctx.epoch, self.checkpointer.validation_monitor, self.checkpointer.prefix
        if (epoch + 1) % self.frequent:
            return
        paths = [epoch_checkpoint_path(prefix, epoch)]
        if monitor is not None and monitor.best_epoch == epoch:
            paths.append(best_checkpoint_path(prefix))
        _save(self.checkpointer, paths, ctx)


class StepCheckpoint(HookBase):
    """Hook: ``{prefix}-{epoch:04d}-b{batches:07d}.model`` every ``every_steps``
    optimizer steps (TRAIN.CHECKPOINT_STEPS; applied and skipped steps both count) and every ``also_every``
    steps (TRAIN.CHECKPOINT_EVERY_FRACTION of the run, see :func:`fraction_steps`; 0: off, and
    ``every_steps`` 0 leaves only these), keeping the ``keep`` newest such files (TRAIN.CHECKPOINT_KEEP).

    Saves only when a micro-batch ends an accumulation group (``ctx.step_ended``): then no partial
    gradients exist and the file resumes exactly. Runs in ``after_batch``, after the LR hook's
    ``after_step``, so the saved scheduler has taken the step.
    """

    def __init__(self, checkpointer, every_steps, keep=2, also_every=0):
        if max(every_steps, also_every) < 1 or min(every_steps, also_every) < 0 or keep < 1:
            raise ValueError("TRAIN.CHECKPOINT_STEPS (or the steps of CHECKPOINT_EVERY_FRACTION) and "
                             "TRAIN.CHECKPOINT_KEEP must be >= 1, got {}, {} and {}".format(every_steps, also_every, keep))
        self.checkpointer = checkpointer
        self.every_steps = every_steps
        self.periods = [p for p in (every_steps, also_every) if p > 0]
        self.keep = keep

    def after_batch(self, ctx):
        state, prefix = ctx.state, self.checkpointer.prefix
        if not ctx.step_ended or all(tried_steps(state) % every for every in self.periods):
            return
        _save(self.checkpointer, step_checkpoint_path(prefix, state["epoch"], state["epoch_batch"]), ctx)
        prune_step_checkpoints(prefix, self.keep)


class PreemptionCheckpoint(HookBase):
    """Hook: stop for a :class:`common.runtime.preemption.PreemptionGuard` request, with a checkpoint.

    At each step boundary (``after_batch`` of a micro-batch that ended a group) and each epoch end but
    the last, the ranks agree through one MAX all-reduce of the pending flag
    (:func:`common.runtime.distributed.any_rank`),
    so a signal that reached one rank stops all of them at the same step. Then every rank saves
    ``{prefix}-{epoch:04d}-b{batches:07d}.model`` of the current position (not again when a checkpoint hook
    has just saved it), waits until rank 0 has written it, and raises :class:`common.runtime.preemption.Preempted`.
    A signal during validation lets the validation end: the stop comes after the epoch's checkpoint.
    Put it after the other checkpoint hooks.
    """

    def __init__(self, checkpointer, guard):
        self.checkpointer = checkpointer
        self.guard = guard

    def after_batch(self, ctx):
        if ctx.step_ended:
            self._stop_if_requested(ctx)

    def after_epoch(self, ctx):
        if ctx.epoch + 1 < ctx.end_epoch:  # after the last epoch the run is complete
            self._stop_if_requested(ctx)

    def _stop_if_requested(self, ctx):
        if not cdist.any_rank(self.guard.requested is not None):
            return
        self.guard.reached()
        state = ctx.state
        position = (state["epoch"], state["epoch_batch"])
        path = step_checkpoint_path(self.checkpointer.prefix, *position)
        if self.checkpointer.saved_at != position:
            _save(self.checkpointer, path, ctx)
        cdist.barrier()  # no rank exits (and gets its peers killed) before rank 0 has written the file
        message = ("preempted: stopped at epoch {}, batch {}, optimizer step {}; checkpoint saved, exiting with "
                   "code {} (TRAIN.AUTO_RESUME continues from it)".format(*position, state["global_step"],
                                                                          PREEMPTED_EXIT_CODE))
        if ctx.is_main:
            get_logger("preemption").warning(message)
        raise Preempted(message)


def fraction_steps(fraction, steps_per_epoch, epochs):
    """Optimizer steps between the checkpoints of TRAIN.CHECKPOINT_EVERY_FRACTION: ``fraction`` of the
    run's ``steps_per_epoch * epochs`` steps, rounded, at least 1."""
    return max(1, int(round(fraction * steps_per_epoch * epochs)))


def checkpoint_hooks(checkpointer, cfg, steps_per_epoch=0):
    """The checkpoint hooks a config asks for: the epoch-end one, then the mid-epoch one when
    TRAIN.CHECKPOINT_STEPS > 0 or TRAIN.CHECKPOINT_EVERY_FRACTION > 0 (then ``steps_per_epoch``, the
    optimizer steps of an epoch, sizes the fraction), both saving through ``checkpointer``.

    Returns:
        list of hooks.
    """
    train = cfg.TRAIN
    hooks = [Checkpoint(checkpointer, cfg.CHECKPOINT_FREQUENT)]
    also_every = 0
    if train.CHECKPOINT_EVERY_FRACTION > 0:
        also_every = fraction_steps(train.CHECKPOINT_EVERY_FRACTION, steps_per_epoch,
                                    train.END_EPOCH - train.BEGIN_EPOCH)
    if train.CHECKPOINT_STEPS > 0 or also_every:
        hooks.append(StepCheckpoint(checkpointer, train.CHECKPOINT_STEPS, train.CHECKPOINT_KEEP, also_every))
    return hooks
