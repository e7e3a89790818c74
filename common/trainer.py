"""The training loop every task runs: micro-batches, accumulation, loss scaling, clipping, callbacks.

One optimizer step, as the loop does it (``k = gradient_accumulate_steps``)::

    for each micro-batch of a group:               # groups: k consecutive batches of one epoch
        outputs, loss = net(*batch)                # batch moved to the model's device
        scaler.backward(loss.mean() / group_size)  # DDP: no_sync() on all but the last one
        metrics.update(outputs)
    last micro-batch: scaler.step(optimizer, clip_grad_norm)   # unscale once, clip, step or skip
                      applied -> lr_scheduler.step(); skipped -> counted, divergence guard
                      optimizer.zero_grad()

Groups start at batch 0 of every epoch and never span two epochs; the last group of an epoch
holds ``r = n_batches % k`` micro-batches when that is not 0 and its losses are divided by r.

Resume contract (``common/checkpoint.py`` and the checkpoint callbacks rely on it)
-------------------------------------------------------------------------------
* :class:`TrainState` is the loop's progress: ``epoch`` (the epoch being trained, or the next one
  once an epoch is done), ``epoch_batch`` (micro-batches of ``epoch`` already consumed),
  ``global_step`` (applied optimizer steps), ``skipped_steps``, ``consecutive_skips``,
  ``last_finite_loss``; ``state_dict()`` / ``load_state_dict()`` give a plain dict.
* ``train(..., state=TrainState)`` resumes: training starts at ``state.epoch`` (``begin_epoch`` is
  ignored) and, when ``state.epoch_batch = m > 0``, skips the first m batches of that epoch:
  through ``train_loader.batch_sampler.skip(m)`` when the batch sampler has it (one-shot; the
  next ``iter(train_loader)`` starts at batch m, ``len(train_loader)`` stays the full epoch),
  else by drawing and dropping m batches. ``set_epoch`` is called before skipping.
* Gradients of an unfinished accumulation group are not saved, so a mid-epoch checkpoint must be
  taken when ``param.add_step`` is True (the batch ended a group: the step was applied or
  skipped, the scheduler advanced, gradients are zero). Then ``state.epoch_batch`` is a multiple
  of k and the groups after resume line up with an uninterrupted run. (Resuming inside a group
  works but that group's step only sees its remaining micro-batches, still divided by its size.)
* The state object is updated in place before callbacks run: at a batch end
  ``state.epoch_batch == param.nbatch + 1``; at an epoch end ``state.epoch == epoch + 1`` and
  ``state.epoch_batch == 0``, so saving it there resumes at the next epoch.
* Batch-end callbacks: ``cb(param)`` with ``param`` a :data:`BatchEndParam` (the reference's
  fields minus ``locals``, plus ``state`` and ``context``); ``param.context`` is the
  :class:`TrainContext` (net, optimizer, lr_scheduler, scaler, state, writer,
  validation_monitor): everything a checkpoint holds. They run on every rank (so collective
  metric reads stay in step); callbacks that write decide by ``param.rank``.
* Epoch-end callbacks: ``cb(epoch, net, optimizer, writer, validation_monitor=...,
  state=..., lr_scheduler=..., scaler=...)`` on every rank, after the validation monitor and
  the plateau scheduler step. ``writer`` is None on ranks other than 0.
* ``scaler`` is a :class:`common.amp.LossScaler`; save ``scaler.state_dict()``.
"""
import logging
import math
import resource
import sys
import time
from collections import namedtuple
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields
from typing import Any, Optional

import torch
import torch.distributed as dist
from tqdm import tqdm

from common import amp

DEFAULT_MAX_CONSECUTIVE_SKIPS = 100

BatchEndParam = namedtuple("BatchEndParam", [
    "epoch",               # current epoch
    "nbatch",              # index of the micro-batch just trained, within the epoch
    "rank",                # process rank, None when not distributed
    "add_step",            # True when this micro-batch ended an accumulation group
    "data_in_time",        # seconds waiting for the loader
    "data_transfer_time",  # seconds moving the batch to the device
    "forward_time",        # seconds in net(*batch) (asynchronous on CUDA: launch time)
    "backward_time",
    "optimizer_time",      # unscale, clip, step, scheduler, zero_grad (0 between steps)
    "metric_time",
    "eval_metric",         # the train metrics
    "state",               # the TrainState (same object as context.state)
    "context",             # the TrainContext
])


@dataclass
class TrainState:
    """Progress of :func:`train`; see the module docstring for when each field changes."""
    epoch: int = 0
    epoch_batch: int = 0
    global_step: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    last_finite_loss: float = math.nan

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            KeyError: a field is missing (names the field).
        """
        for f in fields(self):
            if f.name not in state_dict:
                raise KeyError("train state misses {!r} (has {})".format(f.name, sorted(state_dict)))
            setattr(self, f.name, type(f.default)(state_dict[f.name]))


@dataclass
class TrainContext:
    """What a callback may need to save or inspect, one object for the whole run."""
    net: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    scaler: amp.LossScaler
    state: TrainState
    writer: Any = None
    validation_monitor: Any = None


class TrainingDivergedError(RuntimeError):
    """Too many optimizer steps in a row were skipped for non-finite gradients."""


def _call_all(callbacks, *args, **kwargs):
    if callbacks is None:
        return
    for cb in callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]:
        cb(*args, **kwargs)


def to_device(batch, device):
    """Move the tensors of a batch (tuple/list, nested lists allowed) to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return [to_device(b, device) for b in batch]
    return batch


def _num_samples(batch) -> int:
    """Size of dim 0 of the first tensor in the batch (0 if there is none)."""
    for b in batch:
        if isinstance(b, torch.Tensor) and b.dim() > 0:
            return b.shape[0]
    return 0


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process in MiB: CUDA max allocated on ``device``, else peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 10  # KiB on Linux


class _Loop:
    """State and helpers of one :func:`train` call; :func:`train` is the public entry."""

    def __init__(self, ctx, train_loader, metrics, rank, batch_end_callbacks, clip_grad_norm, k,
                 max_consecutive_skips, log_frequent):
        self.ctx = ctx
        self.loader = train_loader
        self.metrics = metrics
        self.rank = rank
        self.is_main = rank is None or rank == 0
        self.batch_end_callbacks = batch_end_callbacks
        self.clip_grad_norm = clip_grad_norm if clip_grad_norm is not None and clip_grad_norm > 0 else None
        self.k = k
        self.max_consecutive_skips = max_consecutive_skips
        self.log_frequent = log_frequent
        self.device = next(ctx.net.parameters()).device
        self.plateau = isinstance(ctx.lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        self.params = [p for g in ctx.optimizer.param_groups for p in g["params"] if p.requires_grad]
        self.world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.attempts = 0  # optimizer steps tried in this call (applied or skipped)
        self.train_seconds = 0.0  # wall time of run_epoch in this call (validation excluded)
        self.samples = 0   # samples since the last log point, this rank
        self.grad_norm = None  # total norm of the last clipped step
        self.tic = time.perf_counter()

    def _iterate(self):
        """Iterator over the epoch's batches, past the ones a resumed state already consumed."""
        start = self.ctx.state.epoch_batch
        batch_sampler = getattr(self.loader, "batch_sampler", None)
        if start and hasattr(batch_sampler, "skip"):
            batch_sampler.skip(start)
            it = iter(self.loader)
        else:
            it = iter(self.loader)
            for _ in range(start):
                next(it)
        return start, it

    def run_epoch(self, epoch):
        ctx, state, net = self.ctx, self.ctx.state, self.ctx.net
        try:
            n = len(self.loader)
        except TypeError:
            raise TypeError("train_loader must have a len(): the last accumulation group of an "
                            "epoch is normalised by its size") from None
        start, it = self._iterate()
        bar = tqdm(total=n, initial=start, desc="Epoch {}".format(epoch), leave=False, dynamic_ncols=True,
                   disable=not (self.is_main and sys.stdout.isatty()))
        group_loss = None
        nbatch = start - 1
        end = time.perf_counter()
        for nbatch, batch in enumerate(it, start):
            t0 = time.perf_counter()
            group_start = nbatch - nbatch % self.k
            group_size = min(self.k, n - group_start)
            if group_size <= 0:
                raise RuntimeError("train_loader yielded more batches than its len() = {}".format(n))
            add_step = nbatch == group_start + group_size - 1

            batch = to_device(batch, self.device)
            t1 = time.perf_counter()
            sync = nullcontext() if add_step or not hasattr(net, "no_sync") else net.no_sync()
            with sync:
                outputs, loss = net(*batch)
                loss = loss.mean() / group_size
                t2 = time.perf_counter()
                ctx.scaler.backward(loss)
            t3 = time.perf_counter()
            # (group_loss is None after a resume in the middle of a group)
            group_loss = loss.detach() if group_loss is None or nbatch == group_start else group_loss + loss.detach()
            self.samples += _num_samples(batch)

            if add_step:
                self._optimizer_step(epoch, nbatch, group_loss)
            t4 = time.perf_counter()
            if self.metrics is not None:
                self.metrics.update(outputs)
            t5 = time.perf_counter()
            if add_step and self.attempts % self.log_frequent == 0:
                self._log(epoch, nbatch, n, group_loss, bar)

            state.epoch_batch = nbatch + 1
            bar.update(1)
            _call_all(self.batch_end_callbacks, BatchEndParam(
                epoch=epoch, nbatch=nbatch, rank=self.rank, add_step=add_step,
                data_in_time=t0 - end, data_transfer_time=t1 - t0, forward_time=t2 - t1,
                backward_time=t3 - t2, optimizer_time=t4 - t3, metric_time=t5 - t4,
                eval_metric=self.metrics, state=state, context=ctx))
            end = time.perf_counter()
        bar.close()
        if nbatch + 1 != n:
            raise RuntimeError("train_loader yielded {} batches in epoch {}, its len() is {}"
                               .format(nbatch + 1, epoch, n))

    def _optimizer_step(self, epoch, nbatch, group_loss):
        ctx, state = self.ctx, self.ctx.state
        self.attempts += 1
        result = ctx.scaler.step(ctx.optimizer, self.clip_grad_norm, self.params)
        self.grad_norm = result.grad_norm
        loss = group_loss.item()
        if math.isfinite(loss):
            state.last_finite_loss = loss
        if result.applied:
            state.global_step += 1
            state.consecutive_skips = 0
            if ctx.lr_scheduler is not None and not self.plateau:
                ctx.lr_scheduler.step()
        else:
            state.skipped_steps += 1
            state.consecutive_skips += 1
            if state.consecutive_skips >= self.max_consecutive_skips:
                raise TrainingDivergedError(
                    "training diverged: {} optimizer steps in a row had inf/nan gradients (epoch {}, batch {}, "
                    "applied optimizer steps {}, loss scale {:g}, last finite loss {:.6g}); lower TRAIN.LR, "
                    "check the data or raise TRAIN.MAX_CONSECUTIVE_SKIPS".format(
                        state.consecutive_skips, epoch, nbatch, state.global_step, ctx.scaler.scale,
                        state.last_finite_loss))
        ctx.optimizer.zero_grad(set_to_none=True)

    def summary(self):
        """The end-of-run line: applied and skipped optimizer steps (whole run, resumes included),
        the final loss scale and the seconds per optimizer step of this call."""
        state = self.ctx.state
        per_step = self.train_seconds / self.attempts if self.attempts else float("nan")
        return ("Training summary: {} optimizer steps applied, {} skipped (inf/nan gradients); final loss scale "
                "{:g}; {:.4f} s per optimizer step ({} steps in {:.1f} s of training in this run)".format(
                    state.global_step, state.skipped_steps, self.ctx.scaler.scale, per_step, self.attempts,
                    self.train_seconds))

    def _log(self, epoch, nbatch, n, group_loss, bar):
        """Scalars at a log point. ``metrics.get()`` runs on every rank: it may all-reduce."""
        values = dict(self.metrics.get_name_value()) if self.metrics is not None else {}
        now = time.perf_counter()
        speed = self.samples * self.world_size / max(now - self.tic, 1e-9)
        self.samples, self.tic = 0, now
        writer, state = self.ctx.writer, self.ctx.state
        loss = float(group_loss)
        bar.set_postfix(loss="{:.4g}".format(loss), refresh=False)
        if writer is None:
            return
        step = epoch * n + nbatch  # the reference's x axis: global micro-batch index
        writer.add_scalar("Train-Loss", loss, step)
        for name, value in values.items():
            writer.add_scalar("Train-" + name, value, step)
        for i, group in enumerate(self.ctx.optimizer.param_groups):
            writer.add_scalar("LR/Group_{}".format(i), group["lr"], step)
        writer.add_scalar("Loss-Scale", self.ctx.scaler.scale, step)
        if self.grad_norm is not None:
            writer.add_scalar("grad-para/Total-Norm", self.grad_norm, step)
        writer.add_scalar("Skipped-Steps", state.skipped_steps, step)
        writer.add_scalar("Speed/samples_per_s", speed, step)
        writer.add_scalar("Memory/peak_MiB", peak_memory_mb(self.device), step)


def train(net, optimizer, lr_scheduler, train_loader, train_sampler, metrics, begin_epoch, end_epoch,
          logger, rank=None, batch_end_callbacks=None, epoch_end_callbacks=None, writer=None,
          validation_monitor=None, fp16=False, clip_grad_norm=-1, gradient_accumulate_steps=1, *,
          state: Optional[TrainState] = None, scaler: Optional[amp.LossScaler] = None,
          max_consecutive_skips: int = DEFAULT_MAX_CONSECUTIVE_SKIPS, log_frequent: int = 1,
          val_frequent: int = 1) -> TrainState:
    """Train ``net`` from ``begin_epoch`` (or ``state``) to ``end_epoch`` (exclusive).

    Positional arguments are the reference release's ``train``. ``net(*batch)`` must return
    ``(outputs: dict, loss: tensor)``; a loss with several elements is averaged.

    Args:
        lr_scheduler: stepped after every applied optimizer step; a ``ReduceLROnPlateau`` instead
            once per epoch with ``validation_monitor.host_value``. None: constant LR.
        train_sampler: gets ``set_epoch(epoch)`` each epoch when it has it (may be None).
        metrics: ``update(outputs)`` per micro-batch, ``get()`` at log points (may be None).
        logger: ``logging.Logger`` for progress lines on rank 0 (None: this module's logger).
        writer: tensorboardX ``SummaryWriter``; used on rank 0 only.
        fp16: the reference flag: the optimizer must have gone through ``amp.initialize``.
        clip_grad_norm: max total 2-norm of the trainable params' gradients; <= 0: no clipping.
        gradient_accumulate_steps: micro-batches per optimizer step (k >= 1).
        state: a resumed :class:`TrainState` (see the module docstring); None starts fresh.
        scaler: loss scaler; default the one ``amp.initialize`` attached, else fp32 (no scaling).
        max_consecutive_skips: skipped steps in a row that stop training (TRAIN.MAX_CONSECUTIVE_SKIPS).
        log_frequent: write scalars every this many optimizer steps (metrics are read then).
        val_frequent: validate after epochs ``e`` with ``(e + 1) % val_frequent == 0`` and after the
            last one (VAL_FREQUENT); a plateau schedule steps after each validation.

    Returns:
        The final :class:`TrainState`. Rank 0 logs a summary at the end: optimizer steps applied and
        skipped, the final loss scale and the mean wall time per optimizer step of this call
        (training only: from the first batch of an epoch to its last step, validation excluded).

    Raises:
        ValueError: bad k, fp16 without ``amp.initialize``, plateau schedule without a
            validation monitor.
        TrainingDivergedError: ``max_consecutive_skips`` skipped steps in a row.
    """
    if not isinstance(gradient_accumulate_steps, int) or gradient_accumulate_steps < 1:
        raise ValueError("TRAIN.GRAD_ACCUMULATE_STEPS must be an int >= 1, got {!r}".format(gradient_accumulate_steps))
    if max_consecutive_skips < 1 or log_frequent < 1 or val_frequent < 1:
        raise ValueError("max_consecutive_skips, log_frequent and val_frequent (VAL_FREQUENT) must be >= 1")
    scaler = scaler or amp.scaler_of(optimizer)
    if scaler is None:
        if fp16:
            raise ValueError("fp16=True but the optimizer was not passed through amp.initialize")
        scaler = amp.LossScaler()
    plateau = isinstance(lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    if plateau and validation_monitor is None:
        raise ValueError("TRAIN.LR_SCHEDULE 'plateau' needs a validation monitor")
    logger = logger or logging.getLogger(__name__)
    is_main = rank is None or rank == 0
    state = state if state is not None else TrainState(epoch=begin_epoch)
    ctx = TrainContext(net, optimizer, lr_scheduler, scaler, state, writer if is_main else None, validation_monitor)
    loop = _Loop(ctx, train_loader, metrics, rank, batch_end_callbacks, clip_grad_norm,
                 gradient_accumulate_steps, max_consecutive_skips, log_frequent)

    for epoch in range(state.epoch, end_epoch):
        if is_main:
            logger.info("PROGRESS: %.2f%%", 100.0 * epoch / end_epoch)
        if train_sampler is not None and hasattr(train_sampler, "set_epoch"):
            train_sampler.set_epoch(epoch)
        if metrics is not None:
            metrics.reset()
        net.train()
        optimizer.zero_grad(set_to_none=True)
        tic = time.perf_counter()
        loop.run_epoch(epoch)
        loop.train_seconds += time.perf_counter() - tic

        state.epoch, state.epoch_batch = epoch + 1, 0
        validate = validation_monitor is not None and ((epoch + 1) % val_frequent == 0 or epoch + 1 == end_epoch)
        if validate:
            validation_monitor(epoch, net, optimizer, ctx.writer)
        if plateau and validate:
            lr_scheduler.step(validation_monitor.host_value)
        _call_all(epoch_end_callbacks, epoch, net, optimizer, ctx.writer, validation_monitor=validation_monitor,
                  state=state, lr_scheduler=lr_scheduler, scaler=scaler)
    if is_main:
        logger.info(loop.summary())
    return state
