"""TensorBoard hook: training scalars every ``log_frequent`` optimizer steps, on rank 0.

X axis of every training scalar: the global micro-batch index ``epoch * len(loader) +
micro_batch`` (the reference release's axis; with GRAD_ACCUMULATE_STEPS = k it advances by k
per optimizer step). Validation scalars (``Val-*``, written by the validation monitor) share it, at
the index of the epoch's last micro-batch. A resumed run's writer drops the points past its
checkpoint (``purge_step``), so each x has one point.
"""
import resource
import time

import torch

from .base import HookBase


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process in MiB: CUDA max allocated on ``device``, else peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 10  # KiB on Linux


class TensorBoardHook(HookBase):
    """Writes ``Train-Loss``, ``Train-<metric>``, ``LR/Group_<i>``, ``Loss-Scale``,
    ``grad-para/Total-Norm`` (when clipping), ``Skipped-Steps``, ``Speed/samples_per_s`` (all ranks)
    and ``Memory/peak_MiB``, after every ``log_frequent``-th optimizer step (applied or skipped)
    of this run. Metrics are read on every rank (``get()`` may all-reduce).

    Args:
        log_frequent: optimizer steps between writes (>= 1).
        world_size: ranks whose samples the speed counts (each rank counts its own).
    Raises:
        ValueError: ``log_frequent`` < 1.
    """

    def __init__(self, log_frequent=1, world_size=1):
        if log_frequent < 1:
            raise ValueError("log_frequent must be >= 1, got {}".format(log_frequent))
        self.log_frequent = log_frequent
        self.world_size = world_size
        self.attempts = 0  # optimizer steps tried in this run (applied or skipped)
        self.samples = 0   # samples since the last write, this rank
        self.tic = None

    def before_train(self, ctx):
        self.tic = time.perf_counter()

    def after_batch(self, ctx):
        # Here rather than in after_step: the LR hook's after_step has run, as the logged LR must.
        self.samples += ctx.samples
        if not ctx.step_ended:
            return
        self.attempts += 1
        if self.attempts % self.log_frequent:
            return
        values = dict(ctx.metrics.get_name_value()) if ctx.metrics is not None else {}
        now = time.perf_counter()
        speed = self.samples * self.world_size / max(now - self.tic, 1e-9)
        self.samples, self.tic = 0, now
        writer = ctx.writer
        if writer is None:
            return
        step = ctx.epoch * ctx.batches_per_epoch + ctx.micro_batch
        writer.add_scalar("Train-Loss", float(ctx.loss), step)
        for name, value in values.items():
            writer.add_scalar("Train-" + name, value, step)
        for i, group in enumerate(ctx.optimizer.param_groups):
            writer.add_scalar("LR/Group_{}".format(i), group["lr"], step)
        writer.add_scalar("Loss-Scale", ctx.scaler.scale, step)
        if ctx.grad_norm is not None:
            writer.add_scalar("grad-para/Total-Norm", ctx.grad_norm, step)
        writer.add_scalar("Skipped-Steps", ctx.state["skipped_steps"], step)
        writer.add_scalar("Speed/samples_per_s", speed, step)
        writer.add_scalar("Memory/peak_MiB", peak_memory_mb(next(ctx.net.parameters()).device), step)
