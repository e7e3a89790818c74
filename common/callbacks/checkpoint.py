"""Checkpoint callbacks for :func:`common.trainer.train`: at epoch ends and every N optimizer steps.

Both run on every rank (the RNG states of all ranks are gathered into the file); only rank 0
writes. File names and contents: :mod:`common.checkpoint`. The TensorBoard writer is flushed
before each file is written, so the points up to a checkpoint outlive a crash after it (a resumed
run hides the later ones, see ``purge_step`` in common/engine.py).
"""
from common.checkpoint import (best_checkpoint_path, epoch_checkpoint_path, prune_step_checkpoints,
                               save_checkpoint, step_checkpoint_path)


class Checkpoint:
    """Epoch-end callback: ``{prefix}-{epoch:04d}.model`` every ``frequent`` epochs (CHECKPOINT_FREQUENT),
    also written to ``{prefix}-best.model`` when this epoch is the validation monitor's best.

    Args:
        prefix: ``{output folder}/{MODEL_PREFIX}``.
        frequent (int): save after epochs ``e`` with ``(e + 1) % frequent == 0``.
        config: saved under ``config`` (CfgNode, dict or YAML text), or None.
    """

    def __init__(self, prefix, frequent=1, config=None):
        if frequent < 1:
            raise ValueError("CHECKPOINT_FREQUENT must be >= 1, got {}".format(frequent))
        self.prefix = prefix
        self.frequent = frequent
        self.config = config

    def __call__(self, epoch, net, optimizer, writer=None, validation_monitor=None, state=None,
                 lr_scheduler=None, scaler=None):
        if (epoch + 1) % self.frequent:
            return
        paths = [epoch_checkpoint_path(self.prefix, epoch)]
        if validation_monitor is not None and validation_monitor.best_epoch == epoch:
            paths.append(best_checkpoint_path(self.prefix))
        if writer is not None:
            writer.flush()
        save_checkpoint(paths, net, optimizer, validation_monitor=validation_monitor, scaler=scaler,
                        lr_scheduler=lr_scheduler, train_state=state, config=self.config)


class StepCheckpoint:
    """Batch-end callback: ``{prefix}-{epoch:04d}-b{batches:07d}.model`` every ``every_steps``
    optimizer steps (TRAIN.CHECKPOINT_STEPS; applied and skipped steps both count), keeping the
    ``keep`` newest such files (TRAIN.CHECKPOINT_KEEP).

    Saves only when a batch ends an accumulation group (``param.add_step``): then no partial
    gradients exist and the file resumes exactly.
    """

    def __init__(self, prefix, every_steps, keep=2, config=None):
        if every_steps < 1 or keep < 1:
            raise ValueError("TRAIN.CHECKPOINT_STEPS and TRAIN.CHECKPOINT_KEEP must be >= 1, got {} and {}"
                             .format(every_steps, keep))
        self.prefix = prefix
        self.every_steps = every_steps
        self.keep = keep
        self.config = config

    def __call__(self, param):
        state, ctx = param.state, param.context
        if not param.add_step or (state.global_step + state.skipped_steps) % self.every_steps:
            return
        if ctx.writer is not None:
            ctx.writer.flush()
        save_checkpoint(step_checkpoint_path(self.prefix, state.epoch, state.epoch_batch), ctx.net,
                        ctx.optimizer, validation_monitor=ctx.validation_monitor, scaler=ctx.scaler,
                        lr_scheduler=ctx.lr_scheduler, train_state=state, config=self.config)
        prune_step_checkpoints(self.prefix, self.keep)


def checkpoint_callbacks(prefix, cfg):
    """The checkpoint callbacks a config asks for.

    Returns:
        (epoch_end_callbacks, batch_end_callbacks): lists to extend the trainer's with;
        the batch-end list is empty when TRAIN.CHECKPOINT_STEPS is 0.
    """
    epoch_end = [Checkpoint(prefix, cfg.CHECKPOINT_FREQUENT, cfg)]
    batch_end = []
    if cfg.TRAIN.CHECKPOINT_STEPS > 0:
        batch_end.append(StepCheckpoint(prefix, cfg.TRAIN.CHECKPOINT_STEPS, cfg.TRAIN.CHECKPOINT_KEEP, cfg))
    return epoch_end, batch_end
