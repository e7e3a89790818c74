"""Validation hook: after each epoch run the validation function, track the best host metric."""
import torch.distributed as dist

from common.runtime.logs import get_logger

from .base import HookBase

logger = get_logger(__name__)


def _is_main() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


class ValidationMonitor(HookBase):
    """Calls ``val_func(net, val_loader, metrics, label_index_in_batch)`` after epochs ``e`` with
    ``(e + 1) % val_frequent == 0`` and after the last one (VAL_FREQUENT); ``validated`` says
    whether the epoch just ended was validated.

    Keeps the best value of ``host_metric_name`` (higher is better, as in the reference) and
    its epoch; ``state_dict()`` holds ``best_epoch`` / ``best_val`` (the reference checkpoint's
    ``validation_monitor`` entry). ``host_value`` is the last validation's host metric (what a
    plateau schedule steps on); ``values`` all its metrics (name -> value). Metrics are global when they all-reduce, so every rank agrees;
    lines and scalars are written by rank 0 only.

    Raises (on call):
        KeyError: the metrics do not report ``host_metric_name``.
    """

    def __init__(self, val_func, val_loader, metrics, host_metric_name: str = "Acc", label_index_in_batch: int = -1,
                 val_frequent: int = 1):
        if val_frequent < 1:
            raise ValueError("VAL_FREQUENT must be >= 1, got {}".format(val_frequent))
        self.val_frequent = val_frequent
        self.validated = False
        self.val_func = val_func
        self.val_loader = val_loader
        self.metrics = metrics
        self.host_metric_name = host_metric_name
        self.label_index_in_batch = label_index_in_batch
        self.best_epoch = -1
        self.best_val = -1.0
        self.host_value = float("nan")
        self.values = {}

    def state_dict(self) -> dict:
        return {"best_epoch": self.best_epoch, "best_val": self.best_val}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            KeyError: ``best_epoch`` or ``best_val`` missing.
        """
        for key in ("best_epoch", "best_val"):
            if key not in state_dict:
                raise KeyError("validation monitor state misses {!r} (has {})".format(key, sorted(state_dict)))
        self.best_epoch = int(state_dict["best_epoch"])
        self.best_val = float(state_dict["best_val"])

    def after_epoch(self, ctx) -> None:
        """Validate ``ctx.net`` after ``ctx.epoch``; the ``Val-*`` scalars go on the training scalars'
        axis, at the global index of the epoch's last micro-batch."""
        self.validated = (ctx.epoch + 1) % self.val_frequent == 0 or ctx.epoch + 1 == ctx.end_epoch
        if self.validated:
            self(ctx.epoch, ctx.net, ctx.writer, step=(ctx.epoch + 1) * ctx.batches_per_epoch - 1)

    def __call__(self, epoch: int, net, writer=None, step=None) -> None:
        """Validate after 0-based ``epoch``; ``step`` is the TensorBoard x of the ``Val-*`` scalars
        (None: ``epoch + 1``, the reference's axis)."""
        self.val_func(net, self.val_loader, self.metrics, self.label_index_in_batch)
        values = dict(self.metrics.get_name_value())
        if self.host_metric_name not in values:
            raise KeyError("validation metrics report {}, not the host metric {!r}"
                           .format(sorted(values), self.host_metric_name))
        self.host_value, self.values = values[self.host_metric_name], values
        improved = self.host_value > self.best_val
        if improved:
            self.best_epoch, self.best_val = epoch, self.host_value
        if not _is_main():
            return
        if improved:
            logger.info("New Best Val %s: %s, Epoch: %d", self.host_metric_name, self.best_val, self.best_epoch)
        logger.info("Epoch[{:d}] \tVal-".format(epoch) + "".join("{}={:f},\t".format(n, v) for n, v in values.items()))
        logger.info("Best Val %s: %s, Epoch: %d", self.host_metric_name, self.best_val, self.best_epoch)
        if writer is not None:
            for name, value in values.items():
                writer.add_scalar("Val-" + name, value, epoch + 1 if step is None else step)
