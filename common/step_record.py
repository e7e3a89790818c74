"""The step record: what the trainer measured, written once per micro-batch and read by the hooks.

The idea of detectron2's ``EventStorage``: the loop writes each figure once, in one place, and the
log line (:mod:`common.hooks.speedometer`), TensorBoard (:mod:`common.hooks.tensorboard`) and the
run summary (:mod:`common.hooks.summary`) read it. A reader that reports over a window (a log line
every N batches, a TensorBoard point every N steps) keeps a :meth:`StepRecord.mark` and asks
:meth:`StepRecord.since` / :meth:`StepRecord.samples_per_s` for the figures since then, so there is
one counter of tried steps, one training clock and one throughput formula. The log line's window
(:class:`LogWindow`, every ``LOG_FREQUENT`` micro-batches) is the one both the log line and TensorBoard
report, so their samples/s is one figure.
"""
import resource
from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional, Tuple

import torch

from common.checkpoint.train_state import tried_steps

PHASES = ("data", "transfer", "forward", "backward", "optimizer", "metric")


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process in MiB: CUDA max allocated on ``device``, else peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 10  # KiB on Linux


class Window(NamedTuple):
    """Totals between a :meth:`StepRecord.mark` and now: micro-batches, tried optimizer steps, samples
    (this rank), training seconds and the seconds of each phase (:data:`PHASES`)."""
    micro_batches: int
    tried_steps: int
    samples: int
    seconds: float
    timings: Tuple[float, ...]


@dataclass
class StepRecord:
    """The run's figures, written by :class:`common.trainer.Trainer` before each micro-batch's ``after_step``
    hooks (so ``lrs`` is the LR the step used, not the one the scheduler sets next) and read by its
    ``after_batch`` hooks.

    Every micro-batch: ``samples`` and ``timings`` (of this micro-batch, this rank: seconds of
    :data:`PHASES`); the totals ``micro_batches``, ``total_samples``, ``total_timings`` and ``seconds``
    (training wall time, counted inside epochs only: validation and epoch-end saving are left out).

    Every optimizer step (applied or skipped): ``tried_steps`` (over the whole run, resumes included:
    applied + skipped), ``loss`` (the accumulation group's), ``lrs`` (per param group, the LR of this step),
    ``loss_scale``, ``grad_norm`` (before clipping, None without clipping), ``skipped_steps`` (run-wide) and
    ``memory_mb`` (:func:`peak_memory_mb`).

    ``world_size`` turns this rank's samples into the samples of all ranks.
    """
    world_size: int = 1
    samples: int = 0
    timings: Tuple[float, ...] = (0.,) * len(PHASES)
    micro_batches: int = 0
    total_samples: int = 0
    total_timings: Tuple[float, ...] = (0.,) * len(PHASES)
    seconds: float = 0.
    tried_steps: int = 0
    loss: float = float("nan")
    lrs: List[float] = field(default_factory=list)
    loss_scale: float = 1.
    grad_norm: Optional[float] = None
    skipped_steps: int = 0
    memory_mb: float = 0.

    def write_micro_batch(self, samples: int, timings: Tuple[float, ...], seconds: float) -> None:
        """Record one micro-batch: its ``samples``, its phase ``timings`` and the training ``seconds`` it took."""
        self.samples, self.timings = samples, timings
        self.micro_batches += 1
        self.total_samples += samples
        self.total_timings = tuple(a + b for a, b in zip(self.total_timings, timings))
        self.seconds += seconds

    def write_step(self, loss: float, optimizer, scaler, grad_norm: Optional[float], state: dict,
                   device: torch.device) -> None:
        """Record the optimizer step just tried: ``state`` is the loop's progress
        (:mod:`common.checkpoint.train_state`)."""
        self.tried_steps = tried_steps(state)
        self.skipped_steps = state["skipped_steps"]
        self.loss, self.grad_norm = loss, grad_norm
        self.lrs = [group["lr"] for group in optimizer.param_groups]
        self.loss_scale = scaler.scale
        self.memory_mb = peak_memory_mb(device)

    def mark(self) -> Window:
        """The totals now, to pass to :meth:`since` later."""
        return Window(self.micro_batches, self.tried_steps, self.total_samples, self.seconds, self.total_timings)

    def since(self, mark: Window) -> Window:
        """The totals between ``mark`` and now."""
        return Window(*(tuple(a - b for a, b in zip(now, then)) if isinstance(now, tuple) else now - then
                        for now, then in zip(self.mark(), mark)))

    def samples_per_s(self, mark: Window) -> float:
        """Samples of all ranks per training second since ``mark`` (the one throughput formula)."""
        window = self.since(mark)
        return window.samples * self.world_size / max(window.seconds, 1e-9)


class LogWindow:
    """The log line's window: ``LOG_FREQUENT`` counts micro-batches, by their index in the epoch.

    :meth:`update` is called once per micro-batch, after the record is written. At the first micro-batch
    of an epoch (or of a resumed run) it starts a window and returns ``("start", None, None)``; at every
    other micro-batch index that is a multiple of ``frequent`` it returns ``("log", window, samples_per_s)``
    over the micro-batches since the last one and starts the next window; else ``(None, None, None)``.

    Args:
        frequent: micro-batches between log points (LOG_FREQUENT, >= 1).
    Raises:
        ValueError: ``frequent`` < 1.
    """

    def __init__(self, frequent: int):
        if frequent < 1:
            raise ValueError("LOG_FREQUENT must be >= 1, got {}".format(frequent))
        self.frequent = frequent
        self.epoch = None
        self.mark = None

    def update(self, record: StepRecord, epoch: int, micro_batch: int):
        """See the class docstring: ``(kind, Window or None, samples/s of all ranks or None)``."""
        if epoch != self.epoch:
            self.epoch, self.mark = epoch, record.mark()
            return "start", None, None
        if micro_batch % self.frequent:
            return None, None, None
        window, speed = record.since(self.mark), record.samples_per_s(self.mark)
        self.mark = record.mark()
        return "log", window, speed
