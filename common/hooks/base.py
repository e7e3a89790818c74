"""The hook protocol of :class:`common.trainer.Trainer` and the one context object hooks receive.

The idea of detectron2's ``HookBase``: the loop calls every hook at fixed points, in the order
the hooks were given, with one :class:`TrainContext`::

    before_train
    for each epoch:   before_epoch
        for each micro-batch:   [forward, backward; at a group end: optimizer step]
                                after_step   (only when the micro-batch ended an accumulation group)
                                after_batch  (every micro-batch)
        after_epoch
    after_train

Hooks run on every rank (metric reads may be collectives); hooks that write decide by
``ctx.is_main``. ``ctx.writer`` is None on ranks other than 0.
"""
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from common.step_record import StepRecord


class HookBase:
    """Base class of trainer hooks; override the points you need (all do nothing here)."""

    def before_train(self, ctx: "TrainContext") -> None:
        pass

    def before_epoch(self, ctx: "TrainContext") -> None:
        pass

    def after_step(self, ctx: "TrainContext") -> None:
        """After the optimizer step of an accumulation group (applied or skipped,
        ``ctx.step_applied`` says which), the gradients zeroed, the metrics updated."""

    def after_batch(self, ctx: "TrainContext") -> None:
        """After every micro-batch, ``ctx.state['epoch_batch']`` already counting it."""

    def after_epoch(self, ctx: "TrainContext") -> None:
        """After the last micro-batch of ``ctx.epoch``; ``ctx.state`` already points at the next epoch
        (``state['epoch'] == ctx.epoch + 1``, ``state['epoch_batch'] == 0``), so saving it resumes there."""

    def after_train(self, ctx: "TrainContext") -> None:
        pass


@dataclass
class TrainContext:
    """Everything a hook may read or save, one object for the whole run.

    Run-wide: ``net`` (the trained module, DDP-wrapped or not), ``optimizer``, ``lr_scheduler``
    (None: constant LR), ``scaler`` (:class:`common.amp.LossScaler`), ``state`` (the progress dict
    of :mod:`common.checkpoint.train_state`), ``writer`` (tensorboardX writer on rank 0, else None),
    ``metrics`` (train metrics or None), ``rank`` (None when not distributed), ``end_epoch``.

    Per micro-batch (valid in ``after_step`` / ``after_batch``): ``epoch``; ``micro_batch`` (index
    of the micro-batch in the epoch, from 0); ``batches_per_epoch`` (len of the loader);
    ``step_ended`` (this micro-batch ended an accumulation group: an optimizer step was tried);
    ``step_applied`` (that step was applied, not skipped for inf/nan). The figures (loss, LR, loss
    scale, timings, samples, memory, ...) are in ``record`` (:class:`common.step_record.StepRecord`),
    complete in ``after_batch``.

    ``stop_reason``: set by a hook in ``before_train`` or ``after_epoch`` to end training before the next
    epoch (the loop then calls ``after_train``); empty: go on.
    """
    net: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    scaler: Any
    state: dict
    writer: Any = None
    metrics: Any = None
    rank: Optional[int] = None
    end_epoch: int = 0
    epoch: int = 0
    micro_batch: int = -1
    batches_per_epoch: int = 0
    step_ended: bool = False
    step_applied: bool = False
    record: StepRecord = field(default_factory=StepRecord)
    stop_reason: str = ""

    @property
    def is_main(self) -> bool:
        """True on rank 0 (or when not distributed)."""
        return self.rank is None or self.rank == 0
