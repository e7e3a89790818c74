"""The training loop every task runs: micro-batches, accumulation, loss scaling, clipping, hooks.

One optimizer step, as :class:`Trainer` does it (``k = grad_accumulate_steps``)::

    for each micro-batch of a group:               # groups: k consecutive batches of one epoch
        with autocast(): outputs, loss = net(*batch)   # batch moved to the model's device
        scaler.backward(loss.mean() / group_size)  # DDP: no_sync() on all but the last one; FSDP: no
                                                   # reduce-scatter on all but the last one
        metrics.update(outputs)
    last micro-batch: scaler.step(optimizer, clip_grad_norm)   # unscale once, clip, step or skip
                      optimizer.zero_grad()
    every micro-batch: record the figures (common.step_record.StepRecord; at a step end with the LR that step used)
                       last micro-batch: hooks.after_step (LR schedule, EMA)
                       hooks.after_batch (TensorBoard, speedometer line, mid-epoch checkpoint) read the record
    epoch end:        hooks.after_epoch (validation, plateau LR, checkpoint)

Groups start at batch 0 of every epoch and never span two epochs; the last group of an epoch
holds ``r = n_batches % k`` micro-batches when that is not 0 and its losses are divided by r.
Mixed precision is explicit: the engine builds the autocast context and the
:class:`common.amp.LossScaler` from the config and passes both in; nothing is patched.

Resume contract (``common/checkpoint/checkpointer.py`` and the checkpoint hooks rely on it)
-------------------------------------------------------------------------------
* The loop's progress is the plain dict of :mod:`common.checkpoint.train_state` (``epoch``,
  ``epoch_batch``, ``global_step`` = applied optimizer steps, ...).
* ``train(begin_epoch, end_epoch, state)`` resumes: training starts at ``state['epoch']``
  (``begin_epoch`` is ignored) and, when ``state['epoch_batch'] = m > 0``, goes on after what the
  interrupted run trained of that epoch. When the state records its world size and the batch sampler
  has ``resume``: ``resume(state['epoch_units'], m)``, the rest of the epoch's global order re-sharded
  over this run's ranks, whatever their number (micro-batch indices go on from m; ``len(loader)`` is
  read after it, since it changes with the world size). Otherwise, on the same world size only:
  ``batch_sampler.skip(m)`` when it has it, else drawing and dropping m batches; a different world
  size then stops with :class:`WorldSizeChangeError`. ``batch_sampler.set_epoch`` is called first.
* ``state['epoch_units']`` is kept current at every micro-batch (``batch_sampler.consumed``, int
  arithmetic) and ``state['world_size']`` is this run's, so any mid-epoch checkpoint resumes so.
* Gradients of an unfinished accumulation group are not saved, so a mid-epoch checkpoint must be
  taken at a group end (``ctx.step_ended``). Then ``epoch_batch`` is a multiple of k and the
  groups after resume line up with an uninterrupted run.
"""
import math
import sys
import time
from contextlib import nullcontext
from typing import Callable, Optional, Sequence

from tqdm import tqdm

from common.amp import LossScaler
from common.checkpoint.train_state import check_train_state, new_train_state, tried_steps
from common.data.collate import num_samples, to_device
from common.diagnostics.nonfinite import NonFiniteProbe, should_diagnose
from common.errors import UserInputError
from common.hooks.base import HookBase, TrainContext
from common.runtime.distributed import get_world_size
from common.runtime.logs import get_logger

DEFAULT_MAX_CONSECUTIVE_SKIPS = 100


# Exit code of a run stopped by TrainingDivergedError (0: done, 1: a crash, 2: bad input, 75: preempted).
DIVERGED_EXIT_CODE = 3


class TrainingDivergedError(RuntimeError):
    """Too many optimizer steps in a row were skipped for non-finite gradients (``TRAIN.MAX_CONSECUTIVE_SKIPS``);
    the message says how many, the last finite loss and its step, the loss scale and what to try. The entry
    points end with its one ``error:`` line and :data:`DIVERGED_EXIT_CODE`; the checkpoints already written
    stay as they are (nothing is saved after the first skipped step of the run of skips)."""


class WorldSizeChangeError(UserInputError):
    """A mid-epoch state of W processes resumed on another number with a loader that cannot re-shard
    the rest of the epoch (the multi-task loader of a ``DATASET`` list)."""


class Trainer:
    """Trains ``net`` on ``loader``; ``net(*batch)`` returns ``(outputs: dict, loss: tensor)`` (a loss
    with several elements is averaged).

    Args:
        net: the model (DDP-wrapped, FSDP-sharded (:mod:`common.parallel.fsdp`) or neither), in fp32.
        optimizer: its optimizer.
        loader: iterable of batches with a ``len()``; its ``batch_sampler`` gets ``set_epoch(epoch)``
            each epoch and ``resume(units, m)`` or ``skip(m)`` on a mid-epoch resume when it has them, and
            ``consumed(m)`` to count the epoch's units (see the module docstring).
        scaler: :class:`common.amp.LossScaler` (default: no scaling, fp32/bf16).
        autocast: zero-argument callable returning the forward's context manager
            (:func:`common.amp.autocast_context`; default: no autocast).
        hooks: :class:`common.hooks.base.HookBase` objects, called in this order.
        metrics: train metrics, ``reset()`` each epoch and ``update(outputs)`` per micro-batch.
        lr_scheduler: kept in the context for hooks (stepping it is the LR hook's job).
        writer: tensorboardX writer, handed to hooks on rank 0 only.
        rank: process rank, None when not distributed.
        grad_accumulate_steps: micro-batches per optimizer step (k >= 1).
        clip_grad_norm: max total 2-norm of the trainable params' gradients; None or <= 0: no clipping.
        max_consecutive_skips: skipped steps in a row that stop training (TRAIN.MAX_CONSECUTIVE_SKIPS).
        logger: where the ``PROGRESS`` line goes on rank 0 (default: this module's logger).
        probe: :class:`common.diagnostics.nonfinite.NonFiniteProbe` that names the module where a skipped step's inf/nan
            was born (None: no diagnosis).

    Raises:
        ValueError: ``grad_accumulate_steps`` is not an int >= 1 or ``max_consecutive_skips`` < 1.
    """

    def __init__(self, net, optimizer, loader, *, scaler: Optional[LossScaler] = None,
                 autocast: Callable = nullcontext, hooks: Sequence[HookBase] = (), metrics=None,
                 lr_scheduler=None, writer=None, rank: Optional[int] = None, grad_accumulate_steps: int = 1,
                 clip_grad_norm: Optional[float] = None,
                 max_consecutive_skips: int = DEFAULT_MAX_CONSECUTIVE_SKIPS, logger=None,
                 probe: Optional[NonFiniteProbe] = None):
        if not isinstance(grad_accumulate_steps, int) or grad_accumulate_steps < 1:
            raise ValueError("TRAIN.GRAD_ACCUMULATE_STEPS must be an int >= 1, got {!r}".format(grad_accumulate_steps))
        if max_consecutive_skips < 1:
            raise ValueError("TRAIN.MAX_CONSECUTIVE_SKIPS must be >= 1, got {}".format(max_consecutive_skips))
        self.loader = loader
        self.autocast = autocast
        self.hooks = list(hooks)
        self.k = grad_accumulate_steps
        self.clip_grad_norm = clip_grad_norm if clip_grad_norm is not None and clip_grad_norm > 0 else None
        self.max_consecutive_skips = max_consecutive_skips
        self.logger = logger or get_logger(__name__)
        self.probe = probe
        self.diagnosed = False  # the current run of skipped steps was replayed already
        is_main = rank is None or rank == 0
        self.ctx = TrainContext(net, optimizer, lr_scheduler, scaler or LossScaler(), new_train_state(),
                                writer if is_main else None, metrics, rank)
        self.ctx.record.world_size = get_world_size()
        self.group_loss = None  # the accumulation group's loss so far (a 0-dim tensor)
        self.device = next(net.parameters()).device
        self.params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]

    def _call(self, point):
        for hook in self.hooks:
            getattr(hook, point)(self.ctx)

    def train(self, begin_epoch: int, end_epoch: int, state: Optional[dict] = None) -> dict:
        """Train from ``begin_epoch`` (or the resumed ``state``) to ``end_epoch`` (exclusive).

        Returns:
            the final progress dict (:mod:`common.checkpoint.train_state`).
        Raises:
            KeyError: ``state`` lacks a key.
            TrainingDivergedError: ``max_consecutive_skips`` skipped steps in a row.
            WorldSizeChangeError: a mid-epoch ``state`` of another world size that the loader cannot re-shard.
        """
        ctx = self.ctx
        ctx.state = check_train_state(state) if state is not None else new_train_state(epoch=begin_epoch)
        self.saved_world_size, ctx.state["world_size"] = ctx.state["world_size"], ctx.record.world_size
        ctx.end_epoch = end_epoch
        # A resumed run's step count goes on from the checkpoint's, so step-periodic hooks keep their steps.
        ctx.record.tried_steps = tried_steps(ctx.state)
        ctx.record.skipped_steps = ctx.state["skipped_steps"]
        self._call("before_train")
        for epoch in range(ctx.state["epoch"], end_epoch):
            if ctx.stop_reason:  # a hook ended training (early stopping), now or in the resumed run
                break
            if ctx.is_main:
                self.logger.info("PROGRESS: %.2f%%", 100.0 * epoch / end_epoch)
            ctx.epoch = epoch
            batch_sampler = getattr(self.loader, "batch_sampler", None)
            if hasattr(batch_sampler, "set_epoch"):
                batch_sampler.set_epoch(epoch)
            if ctx.metrics is not None:
                ctx.metrics.reset()
            ctx.net.train()
            ctx.optimizer.zero_grad(set_to_none=True)
            self._call("before_epoch")
            self._run_epoch(epoch)
            ctx.state.update(epoch=epoch + 1, epoch_batch=0, epoch_units=0)
            self._call("after_epoch")
        self._call("after_train")
        return ctx.state

    def _iterate(self):
        """Iterator over the epoch's batches, past the ones a resumed state already consumed (see the
        module docstring); returns (first micro-batch index, iterator)."""
        state, saved = self.ctx.state, self.saved_world_size
        start = state["epoch_batch"]
        batch_sampler = getattr(self.loader, "batch_sampler", None)
        if start and saved and hasattr(batch_sampler, "resume"):
            batch_sampler.resume(state["epoch_units"], start)
            return start, iter(self.loader)
        if start and saved and saved != self.ctx.record.world_size:
            epoch = state["epoch"]
            raise WorldSizeChangeError(
                "the checkpoint of epoch {} batch {} was written by {} process(es), this run has {}: the {} cannot "
                "re-shard the rest of an epoch; resume on {} process(es), or from the epoch-end checkpoint "
                "before it (--opts TRAIN.AUTO_RESUME false TRAIN.RESUME true TRAIN.BEGIN_EPOCH {}{})".format(
                    epoch, start, saved, self.ctx.record.world_size, type(self.loader).__name__, saved, epoch,
                    "" if epoch else "; epoch 0 has none: start over"))
        if start and hasattr(batch_sampler, "skip"):
            batch_sampler.skip(start)
            return start, iter(self.loader)
        it = iter(self.loader)
        for _ in range(start):
            next(it)
        return start, it

    def _run_epoch(self, epoch):
        ctx, state, net = self.ctx, self.ctx.state, self.ctx.net
        start, it = self._iterate()
        try:
            n = len(self.loader)  # after the resume: on another world size the epoch has another length
        except TypeError:
            raise TypeError("the train loader must have a len(): the last accumulation group of an "
                            "epoch is normalised by its size") from None
        ctx.batches_per_epoch = n
        consumed = getattr(getattr(self.loader, "batch_sampler", None), "consumed", None)
        count = getattr(self.loader, "num_samples", num_samples)  # a multi-task loader counts all its data sets
        bar = tqdm(total=n, initial=start, desc="Epoch {}".format(epoch), leave=False, dynamic_ncols=True,
                   disable=not (ctx.is_main and sys.stdout.isatty()))
        micro_batch = start - 1
        end = clock = time.perf_counter()  # clock: the record's training time, which excludes the epoch ends
        for micro_batch, batch in enumerate(it, start):
            t0 = time.perf_counter()
            group_start = micro_batch - micro_batch % self.k
            group_size = min(self.k, n - group_start)
            if group_size <= 0:
                raise RuntimeError("the train loader yielded more batches than its len() = {}".format(n))
            step_ended = micro_batch == group_start + group_size - 1

            if self.probe is not None:
                self.probe.capture(micro_batch, batch, micro_batch == group_start, self.device)
            batch = to_device(batch, self.device)
            t1 = time.perf_counter()
            sync = nullcontext() if step_ended or not hasattr(net, "no_sync") else net.no_sync()
            if hasattr(net, "set_requires_gradient_sync"):  # FSDP2: unsharded gradients accumulate locally
                net.set_requires_gradient_sync(step_ended)
            with sync:
                with self.autocast():
                    outputs, loss = net(*batch)
                loss = loss.mean() / group_size
                t2 = time.perf_counter()
                ctx.scaler.backward(loss)
            t3 = time.perf_counter()
            # (group_loss is None after a resume in the middle of a group)
            first = self.group_loss is None or micro_batch == group_start
            self.group_loss = loss.detach() if first else self.group_loss + loss.detach()
            ctx.micro_batch, ctx.step_ended = micro_batch, step_ended
            if step_ended:
                step_loss, grad_norm = self._optimizer_step()
            t4 = time.perf_counter()
            if ctx.metrics is not None:
                ctx.metrics.update(outputs)
            t5 = time.perf_counter()
            state["epoch_batch"] = micro_batch + 1
            if consumed is not None:
                state["epoch_units"] = consumed(micro_batch + 1)
            bar.update(1)
            # Written before the LR hook's after_step steps the scheduler: the recorded LR is the one this step used.
            ctx.record.write_micro_batch(count(batch), (t0 - end, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4),
                                         t5 - clock)
            clock = t5
            if step_ended:
                ctx.record.write_step(step_loss, ctx.optimizer, ctx.scaler, grad_norm, state, self.device)
                self._call("after_step")
            self._call("after_batch")
            end = time.perf_counter()
        bar.close()
        if micro_batch + 1 != n:
            raise RuntimeError("the train loader yielded {} batches in epoch {}, its len() is {}"
                               .format(micro_batch + 1, epoch, n))

    def _optimizer_step(self):
        """Step (or skip) the optimizer on the group's gradients; returns (group loss, gradient norm or None)."""
        ctx, state = self.ctx, self.ctx.state
        scale = ctx.scaler.scale
        result = ctx.scaler.step(ctx.optimizer, self.clip_grad_norm, self.params)
        ctx.step_applied = result.applied
        loss = self.group_loss.item()
        if result.applied:
            state["global_step"] += 1
            state["consecutive_skips"] = 0
            self.diagnosed = False
        else:
            state["skipped_steps"] += 1
            state["consecutive_skips"] += 1
            if self.probe is not None and not self.diagnosed and should_diagnose(
                    ctx.scaler, scale, state["consecutive_skips"], self.max_consecutive_skips):
                self.diagnosed = True
                self.probe.diagnose(tried_steps(state), scale, self.device)
                if ctx.is_main:
                    self.logger.warning("optimizer step %d skipped for inf/nan: %s", tried_steps(state),
                                        self.probe.report())
        if math.isfinite(loss):
            state["last_finite_loss"], state["last_finite_step"] = loss, tried_steps(state)
        if state["consecutive_skips"] >= self.max_consecutive_skips:
            raise TrainingDivergedError(self._divergence_message())
        ctx.optimizer.zero_grad(set_to_none=True)
        return loss, result.grad_norm

    def _divergence_message(self):
        ctx, state = self.ctx, self.ctx.state
        where = "; " + self.probe.report() if self.probe is not None and self.diagnosed else ""
        if state["last_finite_step"]:
            last = "the last finite loss was {:.6g}, at optimizer step {}".format(
                state["last_finite_loss"], state["last_finite_step"])
        else:
            last = "no step of this run had a finite loss"
        # only what this run can still change: bfloat16 for a float16 run (the only one with a loss scaler),
        # clipping where it is off, else a tighter one
        remedies = ["a lower TRAIN.LR"]
        if ctx.scaler.grad_scaler.is_enabled():
            remedies.append("TRAIN.FP16_DTYPE bfloat16 (fp32's range)")
        if self.clip_grad_norm is None:
            remedies.append("TRAIN.CLIP_GRAD_NORM (e.g. 1.0)")
        else:
            remedies.append("a lower TRAIN.CLIP_GRAD_NORM (now {:g})".format(self.clip_grad_norm))
        return ("training diverged: {} optimizer steps in a row were skipped for inf/nan gradients (epoch {}, batch {}; "
                "step {}, {} applied); {}; loss scale {:g}. The checkpoints written so far are intact. Try {} or {}, "
                "and check the data; TRAIN.MAX_CONSECUTIVE_SKIPS ({}) sets how many skips in a row stop a run{}".format(
                    state["consecutive_skips"], ctx.epoch, ctx.micro_batch, tried_steps(state), state["global_step"],
                    last, ctx.scaler.scale, ", ".join(remedies[:-1]), remedies[-1], self.max_consecutive_skips, where))
