"""LR schedule hook: step the scheduler after every applied optimizer step, or once per epoch
on the validation metric for ``ReduceLROnPlateau`` (TRAIN.LR_SCHEDULE 'plateau')."""
import torch

from .base import HookBase


class LRSchedulerHook(HookBase):
    """Steps ``ctx.lr_scheduler``.

    Warmup / step / linear schedules count applied optimizer steps (a step skipped for inf/nan
    gradients does not advance them). A ``ReduceLROnPlateau`` steps after each epoch's
    validation (VAL_FREQUENT) with ``validation.host_value``; put this hook after the validation hook.

    Args:
        validation: the :class:`common.hooks.validation_monitor.ValidationMonitor` (plateau only).
    Raises:
        ValueError (on :meth:`before_train`): a plateau scheduler without a validation monitor.
    """

    def __init__(self, validation=None):
        self.validation = validation

    @staticmethod
    def _plateau(scheduler):
        return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)

    def before_train(self, ctx):
        if self._plateau(ctx.lr_scheduler) and self.validation is None:
            raise ValueError("TRAIN.LR_SCHEDULE 'plateau' needs a validation monitor")

    def after_step(self, ctx):
        if ctx.step_applied and ctx.lr_scheduler is not None and not self._plateau(ctx.lr_scheduler):
            ctx.lr_scheduler.step()

    def after_epoch(self, ctx):
        if self._plateau(ctx.lr_scheduler) and self.validation.validated:
            ctx.lr_scheduler.step(self.validation.host_value)
