"""Where the time goes: a ``torch.profiler`` trace of chosen optimizer steps, and a warning when the
loop waits for data.

* :class:`StepProfiler` (``TRAIN.PROFILE: [START_STEP, NUM_STEPS]``): profiles the optimizer steps
  START_STEP .. START_STEP + NUM_STEPS - 1 (counted from 1 over the whole run, skipped steps included, as the
  log's step numbers) and writes a Chrome / Perfetto trace, ``profile/rank{R}_steps{A}-{B}.pt.trace.json`` in
  the run folder (TensorBoard's profiler plugin reads that folder: ``tensorboard --logdir RUN_FOLDER/profile``);
  on CUDA also the memory timeline, ``rank{R}_steps{A}-{B}.memory.json`` (``torch.profiler``'s
  ``export_memory_timeline``). A log line names each file.
* :class:`DataWaitWarning`: when the time spent waiting for the next batch is over :data:`DATA_WAIT_SHARE` of
  the training time of a logging window (``LOG_FREQUENT`` micro-batches), one warning per epoch says so and
  names ``NUM_WORKERS_PER_GPU`` and the storage options of docs/data.md.
"""
import os

import torch

from common.hooks.base import HookBase
from common.runtime.logs import get_logger
from common.step_record import LogWindow

logger = get_logger(__name__)

DATA_WAIT_SHARE = 0.2  # of a logging window's training time
KINETO_QUIET = 6  # above Kineto's highest console level (its USDT markers, 5)


class StepProfiler(HookBase):
    """``torch.profiler.profile`` around optimizer steps ``start .. start + num - 1`` (1-based tried steps).

    Args:
        folder: the run folder (the trace goes to its ``profile/`` folder).
        start, num: TRAIN.PROFILE (``start >= 1``, ``num >= 1``).
        device: the training device (CUDA adds the CUDA activities and the memory timeline).
        rank: process rank (None: not distributed); each rank writes its own trace.
    """

    def __init__(self, folder: str, start: int, num: int, device: torch.device, rank=None):
        self.folder, self.start, self.last, self.device, self.rank = folder, start, start + num - 1, device, rank or 0
        self.profiler = None
        self.paths = []

    def _begin(self):
        cuda = self.device.type == "cuda"
        if not cuda:
            # Kineto (torch's profiler library) would print its GPU probe's failure ("gpuGetDeviceCount failed
            # with code 35") and start/stop markers on a machine without GPU; a level set by the user stays.
            os.environ.setdefault("KINETO_LOG_LEVEL", str(KINETO_QUIET))
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        # the memory timeline needs shapes, memory and stacks
        self.profiler = torch.profiler.profile(activities=activities, record_shapes=cuda, profile_memory=cuda,
                                               with_stack=cuda)
        self.profiler.__enter__()

    def _end(self, last):
        profiler, self.profiler = self.profiler, None
        profiler.__exit__(None, None, None)
        name = "rank{}_steps{}-{}".format(self.rank, self.start, last)
        folder = os.path.normpath(os.path.join(self.folder, "profile"))
        os.makedirs(folder, exist_ok=True)
        self.paths = [os.path.join(folder, name + ".pt.trace.json")]
        profiler.export_chrome_trace(self.paths[0])
        if self.device.type == "cuda":
            self.paths.append(os.path.join(folder, name + ".memory.json"))
            profiler.export_memory_timeline(self.paths[1], device=str(self.device))
        logger.info("profiler trace of optimizer steps %d-%d written: %s (Chrome / Perfetto JSON; "
                    "tensorboard --logdir %s shows it in its profiler tab)", self.start, last,
                    ", ".join(self.paths), folder)

    def before_train(self, ctx):
        if ctx.record.tried_steps + 1 == self.start:
            self._begin()

    def after_batch(self, ctx):
        if not ctx.step_ended:
            return
        steps = ctx.record.tried_steps
        if self.profiler is not None and steps >= self.last:
            self._end(steps)
        elif self.profiler is None and steps + 1 == self.start:
            self._begin()

    def after_train(self, ctx):
        if self.profiler is not None:  # the run ended inside the window
            self._end(ctx.record.tried_steps)


class DataWaitWarning(HookBase):
    """Warn (rank 0, once per epoch) when waiting for data is over :data:`DATA_WAIT_SHARE` of a logging window's
    training time (:class:`common.step_record.LogWindow`, the log line's window).

    Args:
        frequent: LOG_FREQUENT.
        num_workers: NUM_WORKERS_PER_GPU, named in the warning.
    """

    def __init__(self, frequent: int, num_workers: int):
        self.window = LogWindow(frequent)
        self.num_workers = num_workers
        self.warned_epoch = None

    def after_batch(self, ctx):
        kind, window, _ = self.window.update(ctx.record, ctx.epoch, ctx.micro_batch)
        if kind != "log" or not ctx.is_main or self.warned_epoch == ctx.epoch or window.seconds <= 0:
            return
        share = window.timings[0] / window.seconds
        if share > DATA_WAIT_SHARE:
            self.warned_epoch = ctx.epoch
            logger.warning(
                "waiting for data took %.0f%% of the training time of the last %d micro-batches (epoch %d, up to "
                "batch %d): the GPUs wait for the loader. Raise NUM_WORKERS_PER_GPU (now %d), or read from faster "
                "storage: a zip (DATASET.ZIP_MODE), an LMDB store (DATASET.LMDB_MODE) or the feature cache on a "
                "local disk (docs/data.md)", 100 * share, window.micro_batches, ctx.epoch, ctx.micro_batch,
                self.num_workers)
