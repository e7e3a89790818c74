"""Speedometer hook: the reference's progress line every ``frequent`` micro-batches."""
from common.runtime.logs import get_logger
from common.step_record import LogWindow

from .base import HookBase

logger = get_logger(__name__)


class Speedometer(HookBase):
    """Log ``Epoch[e] Batch [n]\\tSpeed: x samples/s ETA: d d h h m m\\tData: .. \\tTrain-Acc=..,``.

    Same line as the reference release (log parsers read it), printed on rank 0 only. Speed, ETA and
    the mean seconds per micro-batch of each phase come from the step record over the log window
    (:class:`common.step_record.LogWindow`: the micro-batches since the last line; TensorBoard reports the
    same samples/s). The train metrics are read on every rank since
    ``get()`` may be a collective.

    Args:
        frequent: micro-batches between lines (LOG_FREQUENT; a line at each index in the epoch that is a
            multiple of it).
        batches_per_epoch: len(train_loader), for the ETA.
        epochs: epochs this run trains (END_EPOCH - BEGIN_EPOCH), for the ETA.
    """

    def __init__(self, frequent: int = 50, batches_per_epoch: int = None, epochs: int = None):
        self.window = LogWindow(frequent)
        self.batches_per_epoch = batches_per_epoch
        self.epochs = epochs
        self.start_epoch = None

    def after_batch(self, ctx):
        kind, window, speed = self.window.update(ctx.record, ctx.epoch, ctx.micro_batch)
        if kind == "start":  # first batch of an epoch (or of a resumed run)
            if self.start_epoch is None:
                self.start_epoch = ctx.epoch
            self._emit(ctx, "Speed: - samples/sec ETA: - d - h - m")
            return
        if kind is None:
            return
        fields = "Speed: {:.2f} samples/s ETA: {}\t".format(speed, self._eta(ctx, window))
        fields += "Data: {:.3f} Tran: {:.3f} F: {:.3f} B: {:.3f} O: {:.3f} M: {:.3f}".format(
            *[t / window.micro_batches for t in window.timings])
        self._emit(ctx, fields)

    def _eta(self, ctx, window):
        if self.batches_per_epoch is None or self.epochs is None:
            return "- d - h - m"
        epochs_left = self.start_epoch + self.epochs - ctx.epoch - 1
        batches_left = epochs_left * self.batches_per_epoch + self.batches_per_epoch - ctx.micro_batch
        minutes = int(batches_left * window.seconds / window.micro_batches / 60.)
        return "{:d} d {:2d} h {:2d} m".format(minutes // (24 * 60), minutes // 60 % 24, minutes % 60)

    def _emit(self, ctx, fields):
        line = "Epoch[{:d}] Batch [{:d}]\t{}".format(ctx.epoch, ctx.micro_batch, fields)
        if ctx.metrics is not None:
            line += "\tTrain-" + "".join("{}={:f},\t".format(n, v) for n, v in ctx.metrics.get_name_value())
        if ctx.rank is not None:
            line = "Rank[{:3d}]".format(ctx.rank) + line
        if ctx.is_main:
            logger.info(line)
