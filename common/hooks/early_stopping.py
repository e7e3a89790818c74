"""Early stopping: end training when a validation metric has not improved for ``patience`` validations."""
import math

from common.runtime.logs import get_logger

from .base import HookBase

logger = get_logger(__name__)


class EarlyStopping(HookBase):
    """After each validated epoch (``monitor.validated``) read ``metric`` from the validation monitor's
    metrics; when it has not improved (``mode`` 'min': lower is better, 'max': higher) for ``patience``
    validations in a row, set ``ctx.stop_reason`` and log it: the loop ends after this epoch, once the
    epoch's checkpoints (and ``-best.model``, the validation monitor's best) are written.

    Its state (best value and epoch, validations without improvement, the stop reason) is saved in the
    checkpoint under ``early_stopping``; a run resumed after the stop ends at once with the same reason.

    Args:
        monitor: :class:`common.hooks.validation_monitor.ValidationMonitor` (runs before this hook).
        metric: name of a validation metric (TRAIN.EARLY_STOP_METRIC, e.g. 'Loss' or 'Acc').
        mode: 'min' or 'max' (TRAIN.EARLY_STOP_MODE).
        patience: int >= 1 (TRAIN.EARLY_STOP_PATIENCE).
    Raises:
        ValueError: bad ``mode`` or ``patience``. KeyError (after a validation): the metrics do not report
        ``metric``.
    """

    def __init__(self, monitor, metric, mode="min", patience=10):
        if mode not in ("min", "max") or patience < 1:
            raise ValueError("TRAIN.EARLY_STOP_MODE must be 'min' or 'max' and TRAIN.EARLY_STOP_PATIENCE >= 1, got "
                             "{!r} and {}".format(mode, patience))
        self.monitor, self.metric, self.mode, self.patience = monitor, metric, mode, patience
        self.best, self.best_epoch, self.bad_validations, self.reason = math.nan, -1, 0, ""

    def state_dict(self):
        return {"best": self.best, "best_epoch": self.best_epoch, "bad_validations": self.bad_validations,
                "reason": self.reason}

    def load_state_dict(self, state):
        self.best, self.best_epoch = float(state["best"]), int(state["best_epoch"])
        self.bad_validations, self.reason = int(state["bad_validations"]), str(state["reason"])

    def before_train(self, ctx):
        if self.reason:
            ctx.stop_reason = self.reason
            if ctx.is_main:
                logger.info("not training further: this run had stopped early (%s)", self.reason)

    def after_epoch(self, ctx):
        if not self.monitor.validated:
            return
        values = dict(self.monitor.metrics.get_name_value())
        if self.metric not in values:
            raise KeyError("TRAIN.EARLY_STOP_METRIC {!r}: the validation metrics are {}".format(
                self.metric, sorted(values)))
        value = values[self.metric]
        if self.best_epoch < 0 or (value < self.best if self.mode == "min" else value > self.best):
            self.best, self.best_epoch, self.bad_validations = value, ctx.epoch, 0
            return
        self.bad_validations += 1
        if self.bad_validations >= self.patience:
            self.reason = ("early stopping after epoch {}: Val-{} has not improved for {} validations (best {:.6g} "
                           "at epoch {}, mode {})".format(ctx.epoch, self.metric, self.bad_validations, self.best,
                                                          self.best_epoch, self.mode))
            ctx.stop_reason = self.reason
            if ctx.is_main:
                logger.info("%s; the best model is the validation monitor's -best.model (epoch %d)",
                            self.reason, self.monitor.best_epoch)
