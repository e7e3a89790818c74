"""TensorBoard hook: training scalars at the optimizer steps of the log points (every ``LOG_FREQUENT``
micro-batches), on rank 0.

X axis of every training scalar: the global micro-batch index ``epoch * len(loader) +
micro_batch`` (the reference release's axis; with GRAD_ACCUMULATE_STEPS = k it advances by k
per optimizer step). Validation scalars (``Val-*``, written by the validation monitor) share it, at
the index of the epoch's last micro-batch. A resumed run's writer drops the points past its
checkpoint (``purge_step``), so each x has one point.
"""
from common.step_record import LogWindow

from .base import HookBase


class TensorBoardHook(HookBase):
    """Writes ``Train-Loss``, ``Train-<metric>``, ``LR/Group_<i>``, ``Loss-Scale``,
    ``grad-para/Total-Norm`` (when clipping), ``Skipped-Steps``, ``Speed/samples_per_s`` (all ranks)
    and ``Memory/peak_MiB``, from the step record (:mod:`common.step_record`).

    ``log_frequent`` counts micro-batches, as the log line does (:class:`common.step_record.LogWindow`): the
    scalars are written at the end of each optimizer step (applied or skipped) that trained a micro-batch
    whose index in the epoch is a multiple of ``log_frequent`` (every step when ``log_frequent`` <=
    GRAD_ACCUMULATE_STEPS), so a resumed run writes where an uninterrupted one would.
    ``Speed/samples_per_s`` is the figure of the step's last log line (not written when that line is an
    epoch's first, which has none). Metrics are read on every rank (``get()`` may all-reduce).

    Args:
        log_frequent: micro-batches between log points (LOG_FREQUENT, >= 1).
    Raises:
        ValueError: ``log_frequent`` < 1.
    """

    def __init__(self, log_frequent=1):
        self.window = LogWindow(log_frequent)
        self.due = False  # a log point lies in the accumulation group under way
        self.speed = None

    def after_batch(self, ctx):
        record = ctx.record
        kind, _, speed = self.window.update(record, ctx.epoch, ctx.micro_batch)
        if kind is not None:
            self.speed = speed  # None at an epoch's first micro-batch: its log line has no figure
        self.due = self.due or ctx.micro_batch % self.window.frequent == 0
        if not (ctx.step_ended and self.due):
            return
        self.due = False
        values = dict(ctx.metrics.get_name_value()) if ctx.metrics is not None else {}
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
        if self.speed is not None:
            writer.add_scalar("Speed/samples_per_s", self.speed, step)
        writer.add_scalar("Memory/peak_MiB", record.memory_mb, step)
