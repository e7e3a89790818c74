"""Batch-end callback printing the reference's progress line every ``frequent`` batches."""
import time

from common.logs import get_logger

logger = get_logger(__name__)


class Speedometer:
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

    def __call__(self, param):
        times = (param.data_in_time, param.data_transfer_time, param.forward_time, param.backward_time,
                 param.optimizer_time, param.metric_time)
        if param.epoch != self.epoch:  # first batch of an epoch (or of a resumed run)
            if self.start_epoch is None:
                self.start_epoch = param.epoch
            self.epoch, self.tic, self._times = param.epoch, time.time(), [0.] * 6
            self._emit(param, "Speed: - samples/sec ETA: - d - h - m")
            return
        self._times = [a + b for a, b in zip(self._times, times)]
        if param.nbatch % self.frequent:
            return
        speed = self.frequent * self.batch_size / max(time.time() - self.tic, 1e-9)
        fields = "Speed: {:.2f} samples/s ETA: {}\t".format(speed, self._eta(param, speed))
        fields += "Data: {:.3f} Tran: {:.3f} F: {:.3f} B: {:.3f} O: {:.3f} M: {:.3f}".format(
            *[t / self.frequent for t in self._times])
        self._emit(param, fields)
        self.tic, self._times = time.time(), [0.] * 6

    def _eta(self, param, speed):
        if self.batches_per_epoch is None or self.epochs is None:
            return "- d - h - m"
        epochs_left = self.start_epoch + self.epochs - param.epoch - 1
        batches_left = epochs_left * self.batches_per_epoch + self.batches_per_epoch - param.nbatch
        minutes = int(batches_left * self.batch_size / speed / 60.)
        return "{:d} d {:2d} h {:2d} m".format(minutes // (24 * 60), minutes // 60 % 24, minutes % 60)

    def _emit(self, param, fields):
        line = "Epoch[{:d}] Batch [{:d}]\t{}".format(param.epoch, param.nbatch, fields)
        if param.eval_metric is not None:
            line += "\tTrain-" + "".join("{}={:f},\t".format(n, v) for n, v in param.eval_metric.get_name_value())
        if param.rank is not None:
            line = "Rank[{:3d}]".format(param.rank) + line
        if param.rank is None or param.rank == 0:
            logger.info(line)
