"""TensorBoard hook: training scalars every ``log_frequent`` optimizer steps, on rank 0.

X axis of every training scalar: the global micro-batch index ``epoch * len(loader) +
micro_batch`` (the reference release's axis; with GRAD_ACCUMULATE_STEPS = k it advances by k
per optimizer step). Validation scalars (``Val-*``, written by the validation monitor) share it, at
the index of the epoch's last micro-batch. A resumed run's writer drops the points past its
checkpoint (``purge_step``), so each x has one point.
"""
from .base import HookBase


class TensorBoardHook(HookBase):
    """Writes ``Train-Loss``, ``Train-<metric>``, ``LR/Group_<i>``, ``Loss-Scale``,
    ``grad-para/Total-Norm`` (when clipping), ``Skipped-Steps``, ``Speed/samples_per_s`` (all ranks)
    and ``Memory/peak_MiB``, from the step record (:mod:`common.events`), after every
    ``log_frequent``-th optimizer step (applied or skipped; counted over the whole run, so a resumed
    run writes at the steps an uninterrupted one would). Metrics are read on every rank (``get()``
    may all-reduce).

    Args:
        log_frequent: optimizer steps between writes (>= 1).
    Raises:
        ValueError: ``log_frequent`` < 1.
    """

    def __init__(self, log_frequent=1):
        if log_frequent < 1:
            raise ValueError("log_frequent must be >= 1, got {}".format(log_frequent))
        self.log_frequent = log_frequent
        self.mark = None

    def before_train(self, ctx):
        self.mark = ctx.record.mark()

    def after_batch(self, ctx):
        # Here rather than in after_step: the record is written after the LR hook's after_step, as the logged LR must.
        record = ctx.record
        if not ctx.step_ended or record.tried_steps % self.log_frequent:
            return
        values = dict(ctx.metrics.get_name_value()) if ctx.metrics is not None else {}
        speed = record.samples_per_s(self.mark)
        self.mark = record.mark()
        writer = ctx.writer
        if writer is None:
            return
        step = ctx.epoch * ctx.batches_per_epoch + ctx.micro_batch
        writer.add_scalar("Train-Loss", record.loss, step)
        for name, value in values.items():
            writer.add_scalar("Train-" + name, value, step)
        for i, lr in enumerate(record.lrs):
            writer.add_scalar("LR/Group_{}".format(i), lr, step)
        writer.add_scalar("Loss-Scale", record.loss_scale, step)
        if record.grad_norm is not None:
            writer.add_scalar("grad-para/Total-Norm", record.grad_norm, step)
        writer.add_scalar("Skipped-Steps", record.skipped_steps, step)
        writer.add_scalar("Speed/samples_per_s", speed, step)
        writer.add_scalar("Memory/peak_MiB", record.memory_mb, step)
