"""Speedometer hook: the reference's progress line every ``frequent`` micro-batches."""
import time

from common.logs import get_logger

from .base import HookBase

logger = get_logger(__name__)


class Speedometer(HookBase):
    """Log ``Epoch[e] Batch [n]\\tSpeed: x samples/s ETA: d d h h m m\\tData: .. \\tTrain-Acc=..,``.

    Same line as the reference release (log parsers read it), printed on rank 0 only. The train
    metrics are read on every rank since ``get()`` may be a collective.

    Args:
        batch_size: samples per micro-batch over all ranks (BATCH_IMAGES * world size).
        frequent: batches between lines (LOG_FREQUENT).
        batches_per_epoch: len(train_loader), for the ETA.
        epochs: epochs this run trains (END_EPOCH - BEGIN_EPOCH), for the ETA.
    """

    def __init__(self, batch_size: int, frequent: int = 50, batches_per_epoch: int = None, epochs: int = None):
        self.batch_size = batch_size
        self.frequent = frequent
        self.batches_per_epoch = batches_per_epoch
        self.epochs = epochs
        self.epoch = None
        self.start_epoch = None
        self.tic = None
        self._times = [0.] * 6

    def after_batch(self, ctx):
        times = ctx.timings
        if ctx.epoch != self.epoch:  # first batch of an epoch (or of a resumed run)
            if self.start_epoch is None:
                self.start_epoch = ctx.epoch
            self.epoch, self.tic, self._times = ctx.epoch, time.time(), [0.] * 6
            self._emit(ctx, "Speed: - samples/sec ETA: - d - h - m")
            return
        self._times = [a + b for a, b in zip(self._times, times)]
        if ctx.micro_batch % self.frequent:
            return
        speed = self.frequent * self.batch_size / max(time.time() - self.tic, 1e-9)
        fields = "Speed: {:.2f} samples/s ETA: {}\t".format(speed, self._eta(ctx, speed))
        fields += "Data: {:.3f} Tran: {:.3f} F: {:.3f} B: {:.3f} O: {:.3f} M: {:.3f}".format(
            *[t / self.frequent for t in self._times])
        self._emit(ctx, fields)
        self.tic, self._times = time.time(), [0.] * 6

    def _eta(self, ctx, speed):
        if self.batches_per_epoch is None or self.epochs is None:
            return "- d - h - m"
        epochs_left = self.start_epoch + self.epochs - ctx.epoch - 1
        batches_left = epochs_left * self.batches_per_epoch + self.batches_per_epoch - ctx.micro_batch
        minutes = int(batches_left * self.batch_size / speed / 60.)
        return "{:d} d {:2d} h {:2d} m".format(minutes // (24 * 60), minutes // 60 % 24, minutes % 60)

    def _emit(self, ctx, fields):
        line = "Epoch[{:d}] Batch [{:d}]\t{}".format(ctx.epoch, ctx.micro_batch, fields)
        if ctx.metrics is not None:
            line += "\tTrain-" + "".join("{}={:f},\t".format(n, v) for n, v in ctx.metrics.get_name_value())
        if ctx.rank is not None:
            line = "Rank[{:3d}]".format(ctx.rank) + line
        if ctx.is_main:
            logger.info(line)
