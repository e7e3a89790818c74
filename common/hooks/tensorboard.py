"""TensorBoard hook: training scalars at the optimizer steps of the log points (every ``LOG_FREQUENT``
micro-batches), on rank 0.

X axis of every training scalar: the global micro-batch index ``epoch * len(loader) +
micro_batch`` (the reference release's axis; with GRAD_ACCUMULATE_STEPS = k it advances by k
per optimizer step). Validation scalars (``Val-*``, written by the validation monitor) share it, at
the index of the epoch's last micro-batch. A resumed run's writer drops the points past its
checkpoint (``purge_step``), so each x has one point.

:class:`TrainingScalars` picks the points and the figures; the experiment trackers (:mod:`common.trackers`)
report the same ones.
"""
from common.step_record import LogWindow

from .base import HookBase


class TrainingScalars(HookBase):
    """Picks the log points and reads their figures from the step record (:mod:`common.step_record`):
    ``Train-Loss``, ``Train-<metric>``, ``LR/Group_<i>``, ``Loss-Scale``, ``grad-para/Total-Norm`` (when
    clipping), ``Skipped-Steps``, ``Speed/samples_per_s`` (all ranks), ``Time/data_s`` (mean seconds per
    micro-batch waiting for data, this rank) and ``Memory/peak_MiB``; a subclass's :meth:`report` writes them.

    ``log_frequent`` counts micro-batches, as the log line does (:class:`common.step_record.LogWindow`): the
    scalars are reported at the end of each optimizer step (applied or skipped) that trained a micro-batch
    whose index in the epoch is a multiple of ``log_frequent`` (every step when ``log_frequent`` <=
    GRAD_ACCUMULATE_STEPS), so a resumed run reports where an uninterrupted one would. ``Speed/samples_per_s``
    and ``Time/data_s`` are the figures of the step's last log line (not reported when that line is an
    epoch's first, which has none). Metrics are read on every rank (``get()`` may all-reduce).

    Args:
        log_frequent: micro-batches between log points (LOG_FREQUENT, >= 1).
    Raises:
        ValueError: ``log_frequent`` < 1.
    """

    def __init__(self, log_frequent=1):
        self.window = LogWindow(log_frequent)
        self.due = False  # a log point lies in the accumulation group under way
        self.speed = self.data_s = None

    def after_batch(self, ctx):
        record = ctx.record
        kind, window, speed = self.window.update(record, ctx.epoch, ctx.micro_batch)
        if kind is not None:  # None at an epoch's first micro-batch: its log line has no figure
            self.speed = speed
            self.data_s = window.timings[0] / window.micro_batches if window is not None else None
        self.due = self.due or ctx.micro_batch % self.window.frequent == 0
        if not (ctx.step_ended and self.due):
            return
        self.due = False
        values = dict(ctx.metrics.get_name_value()) if ctx.metrics is not None else {}
        scalars = {"Train-Loss": record.loss}
        scalars.update(("Train-" + name, value) for name, value in values.items())
        scalars.update(("LR/Group_{}".format(i), lr) for i, lr in enumerate(record.lrs))
        scalars["Loss-Scale"] = record.loss_scale
        if record.grad_norm is not None:
            scalars["grad-para/Total-Norm"] = record.grad_norm
        scalars["Skipped-Steps"] = record.skipped_steps
        if self.speed is not None:
            scalars["Speed/samples_per_s"] = self.speed
            scalars["Time/data_s"] = self.data_s
        scalars["Memory/peak_MiB"] = record.memory_mb
        self.report(ctx, ctx.epoch * ctx.batches_per_epoch + ctx.micro_batch, scalars)

    def report(self, ctx, step: int, scalars: dict) -> None:
        """Write ``scalars`` (tag -> float) at TensorBoard's x ``step``; called on every rank."""
        raise NotImplementedError


class TensorBoardHook(TrainingScalars):
    """Writes :class:`TrainingScalars`'s figures to ``ctx.writer`` (rank 0's tensorboardX writer)."""

    def report(self, ctx, step, scalars):
        if ctx.writer is None:
            return
        for tag, value in scalars.items():
            ctx.writer.add_scalar(tag, value, step)
